//! A decoded change's feed rows: the keys a row change added and removed,
//! in the canonical text the feed's triggers record.

use super::pgoutput::{Message, Relation, Tuple, Value};

/// The type OID of `char(n)` (`bpchar`): its text keeps the padding that
/// its cast to `text`, which the triggers record, trims.
const BPCHAR: u32 = 1042;

/// One feed row: a guard's key, added (`i`) or removed (`d`), or the
/// guard's table truncated (`t`, no key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FeedRow {
    pub(crate) guard: String,
    pub(crate) kind: u8,
    pub(crate) key: String,
}

/// Where a guard's key columns are in a relation.
#[derive(Debug, Clone)]
pub(crate) struct KeyColumns {
    guard: String,
    /// Each key column's position, and whether its type is padded.
    positions: Vec<(usize, bool)>,
}

/// A watched table the log cannot follow exactly.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum RelationError {
    #[error("{table} has no column {column}")]
    Missing { table: String, column: String },
    #[error("{table}: key column {column} is not in the replica identity, so a delete would not carry its key; make the key the primary key, `REPLICA IDENTITY USING INDEX` a unique index on it, or `REPLICA IDENTITY FULL`")]
    NotInIdentity { table: String, column: String },
}

impl KeyColumns {
    /// `guard`'s key columns `names` in `relation`: each must be in the
    /// replica identity (or the identity FULL), or a delete's key is lost.
    pub(crate) fn of(
        relation: &Relation,
        guard: &str,
        names: &[String],
    ) -> Result<Self, RelationError> {
        let table = || format!("{}.{}", relation.namespace, relation.name);
        let positions = names
            .iter()
            .map(|name| {
                let (position, column) = relation
                    .columns
                    .iter()
                    .enumerate()
                    .find(|(_, column)| &column.name == name)
                    .ok_or_else(|| RelationError::Missing {
                        table: table(),
                        column: name.clone(),
                    })?;
                if !column.in_identity && relation.identity != b'f' {
                    return Err(RelationError::NotInIdentity {
                        table: table(),
                        column: name.clone(),
                    });
                }
                Ok((position, column.type_id == BPCHAR))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            guard: guard.to_owned(),
            positions,
        })
    }

    /// The feed rows of `message`, a change of this relation, pushed to
    /// `out`.
    pub(crate) fn rows(&self, message: &Message<'_>, out: &mut Vec<FeedRow>) {
        match message {
            Message::Insert { new, .. } => self.push(b'i', self.key(new, None), out),
            Message::Delete { old, .. } => self.push(b'd', self.key(old.tuple(), None), out),
            Message::Update { old, new, .. } => {
                // Without an old tuple the identity's columns, and so the
                // key's, did not change.
                let Some(old) = old else { return };
                let old = old.tuple();
                let (before, after) = (self.key(old, None), self.key(new, Some(old)));
                if before != after {
                    self.push(b'd', before, out);
                    self.push(b'i', after, out);
                }
            }
            Message::Truncate { .. } => out.push(FeedRow {
                guard: self.guard.clone(),
                kind: b't',
                key: String::new(),
            }),
            Message::Relation(_) | Message::Other => {}
        }
    }

    fn push(&self, kind: u8, key: Option<String>, out: &mut Vec<FeedRow>) {
        if let Some(key) = key {
            out.push(FeedRow {
                guard: self.guard.clone(),
                kind,
                key,
            });
        }
    }

    /// The canonical key of `tuple`: `None` if a part is null (the
    /// triggers record no key then) or not UTF-8. An unchanged TOASTed part is taken
    /// from `before`.
    fn key(&self, tuple: &Tuple<'_>, before: Option<&Tuple<'_>>) -> Option<String> {
        let mut parts = Vec::with_capacity(self.positions.len());
        for &(position, padded) in &self.positions {
            let mut value = tuple.0.get(position).copied().unwrap_or(Value::Null);
            if value == Value::Unchanged {
                value = before
                    .and_then(|before| before.0.get(position).copied())
                    .unwrap_or(Value::Null);
            }
            let Value::Text(bytes) = value else {
                return None;
            };
            // Bytes that are not UTF-8 (a SQL_ASCII database): no request
            // names the key, and the scan leaves it out too.
            let mut text = String::from_utf8(bytes.to_vec()).ok()?;
            if padded {
                text.truncate(text.trim_end_matches(' ').len());
            }
            parts.push(text);
        }
        Some(key_of(parts))
    }
}

/// The feed's canonical text of a key from its parts' text, as
/// `bloom_guard.key_of` makes it: one part's text, or each part's length in
/// bytes, a colon and its text.
pub(crate) fn key_of(mut parts: Vec<String>) -> String {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    parts.iter().fold(String::new(), |mut key, part| {
        key.push_str(&part.len().to_string());
        key.push(':');
        key.push_str(part);
        key
    })
}

/// Transactions received and not written yet.
#[derive(Default)]
pub(crate) struct Batch {
    /// Their rows, each with its transaction's end.
    pub(crate) rows: Vec<(u64, FeedRow)>,
    pub(crate) transactions: usize,
    /// The last one's end.
    pub(crate) end: u64,
    /// The first one's commit time (microseconds since 2000-01-01, the
    /// server's clock).
    pub(crate) oldest_commit: Option<i64>,
    /// Whether one of them was written in parts: its progress is written
    /// even with no rows left.
    pub(crate) parted: bool,
}

impl Batch {
    /// At most this many rows, or transactions, go in one write.
    const ROWS: usize = 10_000;

    pub(crate) fn is_empty(&self) -> bool {
        self.transactions == 0
    }

    pub(crate) fn full(&self) -> bool {
        self.rows.len() >= Self::ROWS || self.transactions >= Self::ROWS
    }
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::{Column, Old};
    use super::*;

    fn relation(identity: u8, columns: &[(&str, bool, u32)]) -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "items".into(),
            identity,
            columns: columns
                .iter()
                .map(|&(name, in_identity, type_id)| Column {
                    name: name.into(),
                    in_identity,
                    type_id,
                })
                .collect(),
        }
    }

    fn text(value: &str) -> Value<'_> {
        Value::Text(value.as_bytes())
    }

    fn rows(keys: &KeyColumns, message: &Message<'_>) -> Vec<(char, String)> {
        let mut out = Vec::new();
        keys.rows(message, &mut out);
        out.into_iter()
            .map(|row| (char::from(row.kind), row.key))
            .collect()
    }

    #[test]
    fn a_key_outside_the_replica_identity_is_refused_unless_it_is_full() {
        let by_id = relation(b'd', &[("id", true, 20), ("key", false, 25)]);
        let names = ["key".to_owned()];
        assert!(matches!(
            KeyColumns::of(&by_id, "items", &names),
            Err(RelationError::NotInIdentity { .. })
        ));
        let full = relation(b'f', &[("id", false, 20), ("key", false, 25)]);
        assert!(KeyColumns::of(&full, "items", &names).is_ok());
        assert!(matches!(
            KeyColumns::of(&full, "items", &["name".to_owned()]),
            Err(RelationError::Missing { .. })
        ));
    }

    #[test]
    fn inserts_deletes_and_key_changes_record_what_the_triggers_do() {
        let table = relation(b'i', &[("id", false, 20), ("key", true, 25)]);
        let keys = KeyColumns::of(&table, "items", &["key".to_owned()]).unwrap();
        let insert = Message::Insert {
            relation: 1,
            new: Tuple(vec![text("1"), text("a")]),
        };
        assert_eq!(rows(&keys, &insert), [('i', "a".to_owned())]);
        let delete = Message::Delete {
            relation: 1,
            old: Old::Key(Tuple(vec![Value::Null, text("a")])),
        };
        assert_eq!(rows(&keys, &delete), [('d', "a".to_owned())]);
        let renamed = Message::Update {
            relation: 1,
            old: Some(Old::Key(Tuple(vec![Value::Null, text("a")]))),
            new: Tuple(vec![text("1"), text("b")]),
        };
        assert_eq!(
            rows(&keys, &renamed),
            [('d', "a".to_owned()), ('i', "b".to_owned())]
        );
        // The id changed, the key did not: no row, as with the triggers.
        let same_key = Message::Update {
            relation: 1,
            old: Some(Old::Row(Tuple(vec![text("1"), text("a")]))),
            new: Tuple(vec![text("2"), text("a")]),
        };
        assert!(rows(&keys, &same_key).is_empty());
        let untouched = Message::Update {
            relation: 1,
            old: None,
            new: Tuple(vec![text("1"), Value::Unchanged]),
        };
        assert!(rows(&keys, &untouched).is_empty());
        let null = Message::Insert {
            relation: 1,
            new: Tuple(vec![text("1"), Value::Null]),
        };
        assert!(rows(&keys, &null).is_empty());
    }

    #[test]
    fn composite_and_padded_keys_take_the_triggers_form() {
        let table = relation(b'f', &[("a", false, 25), ("b", false, BPCHAR)]);
        let keys = KeyColumns::of(&table, "g", &["a".to_owned(), "b".to_owned()]).unwrap();
        let insert = Message::Insert {
            relation: 1,
            new: Tuple(vec![text("é"), text("x  ")]),
        };
        assert_eq!(rows(&keys, &insert), [('i', "2:é1:x".to_owned())]);
        assert_eq!(key_of(vec!["only".into()]), "only");
        let not_utf8 = Message::Insert {
            relation: 1,
            new: Tuple(vec![Value::Text(b"\xff"), text("x")]),
        };
        assert!(rows(&keys, &not_utf8).is_empty());
    }
}
