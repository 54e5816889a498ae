//! Whether a guard's key type compares keys as the watched columns do.
//!
//! A key type that compares more strictly than its column (`Text` over a
//! case-insensitive column) would answer "absent" for a spelling the
//! database finds: a follower refuses to let such a guard answer.

use bloom_guard::{BloomGuard, FailOpen, KeyType};

use crate::watch::Watch;

/// A key column as far as comparing keys goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Comparison {
    /// Text compared byte for byte.
    Exact,
    /// Text compared without case (an ICU collation at level 2, `citext`
    /// under a collation that lowers ASCII letters otherwise).
    CaseInsensitive,
    /// Text compared by its `lower()` under the database's default
    /// collation, which lowers ASCII letters as ASCII does (`citext`):
    /// stored keys are read lowered by the database, so a stored key with
    /// other characters is held exactly.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Lowered,
    /// Text compared without ASCII case only (SQLite's `NOCASE`): other
    /// characters compare as themselves.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    AsciiCaseInsensitive,
    /// Text compared as if padded with spaces: trailing spaces are
    /// ignored (PAD SPACE binary collations, SQLite's `RTRIM`, `char(n)`).
    PadSpace,
    /// Text under a nondeterministic collation that keeps case but ignores
    /// some characters (control characters, under ICU at level 3).
    IgnoresCharacters,
    /// Integers: `007` finds `7`.
    Integer,
    /// UUIDs: any spelling finds the value.
    Uuid,
    /// Text under a case- or accent-insensitive collation whose weights
    /// the guard reproduces ([`KeyType::Collated`]): the collation's name.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Collated(String),
    /// No key type compares as the column does; why.
    Unmatched(String),
}

/// One watched key column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyColumn {
    pub(crate) name: String,
    pub(crate) comparison: Comparison,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The key type finds every stored key however the request spells it.
    Fits,
    /// It does, except for spellings the log line names.
    FitsWithCaveat(String),
    /// It can refuse a stored key; the message names the key type to use.
    Refused(String),
}

/// Checks the guard's key type against the watched columns: logs what
/// does not fit, and keeps the guard open (the hold returned) where its key
/// type could refuse a stored key.
pub(crate) fn enforce(
    guard: &BloomGuard,
    watch: &Watch,
    columns: &[KeyColumn],
) -> Option<FailOpen> {
    match check(&watch.table, guard.key_type(), columns) {
        Verdict::Fits => None,
        Verdict::FitsWithCaveat(caveat) => {
            tracing::warn!(guard = guard.name(), %caveat, "a watched key column is compared otherwise than its text");
            None
        }
        Verdict::Refused(problem) => {
            tracing::error!(guard = guard.name(), %problem, "the guard's key type does not compare keys as the watched column does; the guard lets every request through");
            Some(guard.feed().fail_open_because(problem))
        }
    }
}

/// The watched `columns` of `table` that no key type compares as the
/// database does: an error naming each with why (its type or collation and
/// what to change), for `watch` to refuse before it installs anything.
pub(crate) fn comparable(
    table: &str,
    columns: &[KeyColumn],
) -> Result<(), crate::error::FeedError> {
    let uncomparable: Vec<String> = columns
        .iter()
        .filter_map(|column| match &column.comparison {
            Comparison::Unmatched(why) => Some(format!("{table}.{}: {why}", column.name)),
            _ => None,
        })
        .collect();
    if uncomparable.is_empty() {
        Ok(())
    } else {
        Err(crate::error::FeedError::Uncomparable(
            uncomparable.join("; "),
        ))
    }
}

/// The key type that compares keys as the watched `columns` of `table`
/// do: `Err(name)` for a collation whose weights the backend must read;
/// composite keys are text.
pub(crate) fn key_type_for(
    table: &str,
    columns: &[KeyColumn],
    watched: usize,
) -> Result<Result<KeyType, String>, crate::error::FeedError> {
    comparable(table, columns)?;
    if columns.len() != watched {
        // Not created yet, perhaps: a database error, not a column to change.
        return Err(sqlx::Error::ColumnNotFound(format!("a key column of {table}")).into());
    }
    let [column] = columns else {
        return match check_composite(table, columns) {
            Verdict::Refused(why) => Err(crate::error::FeedError::Uncomparable(why)),
            _ => Ok(Ok(KeyType::Text)),
        };
    };
    match &column.comparison {
        Comparison::Exact => Ok(Ok(KeyType::Text)),
        Comparison::Collated(name) => Ok(Err(name.clone())),
        Comparison::Unmatched(why) => Err(crate::error::FeedError::Uncomparable(format!(
            "{table}.{}: {why}",
            column.name
        ))),
        other => Ok(Ok(other.key_type().unwrap_or_default())),
    }
}

impl Comparison {
    /// The key type of a column compared so, where one type fits without
    /// more to read (not under a collation, nor byte for byte, where any
    /// text type fits).
    fn key_type(&self) -> Option<KeyType> {
        Some(match self {
            Comparison::CaseInsensitive
            | Comparison::Lowered
            | Comparison::AsciiCaseInsensitive
            | Comparison::IgnoresCharacters => KeyType::CaseInsensitiveText,
            Comparison::PadSpace => KeyType::SpacePaddedText,
            Comparison::Integer => KeyType::Integer,
            Comparison::Uuid => KeyType::Uuid,
            Comparison::Exact | Comparison::Collated(_) | Comparison::Unmatched(_) => return None,
        })
    }
}

/// Whether the guard is exact only while every stored key is printable
/// ASCII: a case-insensitive key type over a column whose comparison also
/// equates some non-ASCII spellings with ASCII ones the database's
/// `lower()` does not give (ICU collations fold full-width letters and
/// ignore soft hyphens; `citext` under a Turkish locale lowers `I` to
/// `ı`). Not `citext` otherwise: its stored keys are read lowered.
pub(crate) fn needs_ascii_keys(key_type: KeyType, columns: &[KeyColumn]) -> bool {
    key_type == KeyType::CaseInsensitiveText
        && matches!(
            columns,
            [KeyColumn {
                comparison: Comparison::CaseInsensitive | Comparison::IgnoresCharacters,
                ..
            }]
        )
}

/// Whether a stored key holds a byte `needs_ascii_keys` guards against:
/// anything but printable ASCII, tab and line breaks.
pub(crate) fn is_unsafe_key(key: &[u8]) -> bool {
    key.iter().any(|&b| !matches!(b, 9..=13 | 32..=126))
}

/// Why the guard stays open once such a key is stored.
pub(crate) const UNSAFE_KEY: &str = "a stored key holds characters other than printable ASCII under a case-insensitive column, which the database may equate with other spellings the guard cannot reproduce (ICU folds full-width letters; citext under a locale that lowers I to ı): the guard lets every request through";

/// Checks `key_type` against the watched `columns` of `table`.
pub(crate) fn check(table: &str, key_type: KeyType, columns: &[KeyColumn]) -> Verdict {
    match columns {
        [column] => check_one(table, key_type, column),
        _ => check_composite(table, columns),
    }
}

fn check_one(table: &str, key_type: KeyType, column: &KeyColumn) -> Verdict {
    let needed = match &column.comparison {
        Comparison::Exact => return Verdict::Fits,
        Comparison::Unmatched(why) => {
            return Verdict::Refused(format!(
                "{table}.{}: {why}; no key type compares it as the database does, so the guard stays open",
                column.name
            ))
        }
        Comparison::Collated(name) => {
            return match key_type {
                KeyType::Collated(collation) if collation.name().eq_ignore_ascii_case(name) => {
                    Verdict::Fits
                }
                other => Verdict::Refused(format!(
                    "{table}.{} compares keys under collation {name}, but the guard's key type is {other:?}: it would refuse stored keys spelt otherwise; build the guard with the key type Watch::key_type returns",
                    column.name
                )),
            };
        }
        other => match other.key_type() {
            Some(needed) => needed,
            None => return Verdict::Fits,
        },
    };
    // A key type that compares more loosely is safe: requests it cannot
    // put in canonical form pass unchecked.
    let fits = match (&column.comparison, key_type) {
        (_, found) if found == needed => true,
        (
            Comparison::CaseInsensitive
            | Comparison::Lowered
            | Comparison::AsciiCaseInsensitive
            | Comparison::IgnoresCharacters,
            KeyType::Integer | KeyType::Uuid,
        ) => true,
        (Comparison::Integer, KeyType::Uuid) | (Comparison::Uuid, KeyType::Integer) => true,
        _ => false,
    };
    if fits {
        Verdict::Fits
    } else {
        Verdict::Refused(format!(
            "{table}.{} compares keys {}, but the guard's key type is {key_type:?}: it would refuse stored keys spelt otherwise; build the guard with .key_type(KeyType::{needed:?})",
            column.name,
            describe(&column.comparison),
        ))
    }
}

/// Composite keys are compared as text, part by part.
fn check_composite(table: &str, columns: &[KeyColumn]) -> Verdict {
    let mut caveats = Vec::new();
    for column in columns {
        match &column.comparison {
            Comparison::Exact => {}
            Comparison::Integer | Comparison::Uuid => caveats.push(format!(
                "{table}.{} is compared as its text ({}): requests must spell that part as the database prints it",
                column.name,
                describe(&column.comparison),
            )),
            other => {
                return Verdict::Refused(format!(
                    "{table}.{} compares keys {}, but the parts of a composite key are compared byte for byte, so the guard stays open",
                    column.name,
                    describe(other),
                ))
            }
        }
    }
    if caveats.is_empty() {
        Verdict::Fits
    } else {
        Verdict::FitsWithCaveat(caveats.join("; "))
    }
}

fn describe(comparison: &Comparison) -> &str {
    match comparison {
        Comparison::Exact => "byte for byte",
        Comparison::CaseInsensitive | Comparison::Lowered | Comparison::AsciiCaseInsensitive => {
            "without case"
        }
        Comparison::IgnoresCharacters => {
            "ignoring control characters (a nondeterministic collation)"
        }
        Comparison::PadSpace => "ignoring trailing spaces",
        Comparison::Integer => "as integers (007 is 7)",
        Comparison::Uuid => "as UUIDs (any case, braces, no hyphens)",
        Comparison::Collated(_) => "under a case- or accent-insensitive collation",
        Comparison::Unmatched(why) => why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(comparison: Comparison) -> Vec<KeyColumn> {
        vec![KeyColumn {
            name: "key".to_owned(),
            comparison,
        }]
    }

    fn refused(key_type: KeyType, comparison: Comparison) -> bool {
        matches!(
            check("t", key_type, &column(comparison)),
            Verdict::Refused(_)
        )
    }

    #[test]
    fn a_stricter_key_type_is_refused_and_the_message_names_the_right_one() {
        let Verdict::Refused(message) =
            check("users", KeyType::Text, &column(Comparison::CaseInsensitive))
        else {
            panic!("Text over a case-insensitive column must be refused");
        };
        assert!(
            message.contains("KeyType::CaseInsensitiveText"),
            "{message}"
        );
        assert!(refused(KeyType::Text, Comparison::IgnoresCharacters));
        assert!(refused(KeyType::Text, Comparison::Integer));
        assert!(refused(KeyType::CaseInsensitiveText, Comparison::Integer));
        assert!(refused(KeyType::Text, Comparison::Uuid));
        assert!(refused(KeyType::CaseInsensitiveText, Comparison::Uuid));
        // `abc ` finds `abc`; a UUID followed by a space is no UUID.
        assert!(refused(KeyType::Text, Comparison::PadSpace));
        assert!(refused(KeyType::CaseInsensitiveText, Comparison::PadSpace));
        assert!(refused(KeyType::Uuid, Comparison::PadSpace));
        assert!(refused(
            KeyType::SpacePaddedText,
            Comparison::CaseInsensitive
        ));
        for key_type in [
            KeyType::Text,
            KeyType::CaseInsensitiveText,
            KeyType::SpacePaddedText,
            KeyType::Integer,
            KeyType::Uuid,
        ] {
            assert!(refused(key_type, Comparison::Unmatched("name".into())));
        }
    }

    #[test]
    fn an_equal_or_looser_key_type_fits() {
        for key_type in [
            KeyType::Text,
            KeyType::CaseInsensitiveText,
            KeyType::SpacePaddedText,
            KeyType::Integer,
            KeyType::Uuid,
        ] {
            assert!(!refused(key_type, Comparison::Exact), "{key_type:?}");
        }
        assert!(!refused(KeyType::SpacePaddedText, Comparison::PadSpace));
        assert!(!refused(
            KeyType::CaseInsensitiveText,
            Comparison::CaseInsensitive
        ));
        assert!(!refused(
            KeyType::CaseInsensitiveText,
            Comparison::IgnoresCharacters
        ));
        assert!(!refused(KeyType::Integer, Comparison::Integer));
        assert!(!refused(KeyType::Uuid, Comparison::Uuid));
    }

    #[test]
    fn composite_parts_are_text() {
        let parts = |second| {
            vec![
                KeyColumn {
                    name: "tenant".into(),
                    comparison: Comparison::Exact,
                },
                KeyColumn {
                    name: "number".into(),
                    comparison: second,
                },
            ]
        };
        assert_eq!(
            check("t", KeyType::Text, &parts(Comparison::Exact)),
            Verdict::Fits
        );
        assert!(matches!(
            check("t", KeyType::Text, &parts(Comparison::Integer)),
            Verdict::FitsWithCaveat(_)
        ));
        assert!(matches!(
            check("t", KeyType::Text, &parts(Comparison::CaseInsensitive)),
            Verdict::Refused(_)
        ));
    }
}
