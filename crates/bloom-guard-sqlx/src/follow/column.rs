//! Whether a guard's key type compares keys as the watched columns do.
//!
//! A key type that compares more strictly than its column (`Text` over a
//! case-insensitive column) would answer "absent" for a spelling the
//! database finds: a follower refuses to let such a guard answer.

use bloom_guard::{BloomGuard, HoldOpen, KeyType};

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
) -> Option<HoldOpen> {
    match check(&watch.table, guard.key_type(), columns) {
        Verdict::Fits => None,
        Verdict::FitsWithCaveat(caveat) => {
            tracing::warn!(guard = guard.name(), %caveat, "a watched key column is compared otherwise than its text");
            None
        }
        Verdict::Refused(problem) => {
            tracing::error!(guard = guard.name(), %problem, "the guard's key type does not compare keys as the watched column does; the guard lets every request through");
            Some(guard.hold_open_because(problem))
        }
    }
}

/// The watched `columns` of `table` that no key type compares as the
/// database does: an error naming each with why (its type or collation and
/// what to change), for `watch` to refuse before it installs anything.
pub(crate) fn comparable(table: &str, columns: &[KeyColumn]) -> Result<(), crate::FeedError> {
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
        Err(crate::FeedError::Uncomparable(uncomparable.join("; ")))
    }
}

/// The key type that compares keys as the watched `columns` of `table`
/// do: `Err(name)` for a collation whose weights the backend must read;
/// composite keys are text.
pub(crate) fn key_type_for(
    table: &str,
    columns: &[KeyColumn],
    watched: usize,
) -> Result<Result<KeyType, String>, crate::FeedError> {
    comparable(table, columns)?;
    if columns.len() != watched {
        // Not created yet, perhaps: a database error, not a column to change.
        return Err(sqlx::Error::ColumnNotFound(format!("a key column of {table}")).into());
    }
    let [column] = columns else {
        return match check_composite(table, columns) {
            Verdict::Refused(why) => Err(crate::FeedError::Uncomparable(why)),
            _ => Ok(Ok(KeyType::Text)),
        };
    };
    match &column.comparison {
        Comparison::Exact => Ok(Ok(KeyType::Text)),
        Comparison::Collated(name) => Ok(Err(name.clone())),
        Comparison::Unmatched(why) => Err(crate::FeedError::Uncomparable(format!(
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
                    "{table}.{} compares keys under collation {name}, but the guard's key type is {other:?}: it would refuse stored keys spelt otherwise; build the guard with the key type Watch::key_type_mysql returns",
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

/// A Postgres column's comparison, from its base type's name, its type as
/// declared, its collation (`None`: deterministic), and whether `lower()`
/// under it is the database default's and lowers ASCII letters as ASCII
/// does (not so under a Turkish locale, where `I` lowers to `ı`).
#[cfg(any(feature = "postgres", test))]
pub(crate) fn postgres_comparison(
    base_type: &str,
    is_enum: bool,
    declared: &str,
    nondeterministic_locale: Option<&str>,
    lowers_as_ascii: bool,
) -> Comparison {
    match base_type {
        "int2" | "int4" | "int8" => Comparison::Integer,
        "uuid" => Comparison::Uuid,
        "citext" if lowers_as_ascii => Comparison::Lowered,
        "citext" => Comparison::CaseInsensitive,
        "bpchar" => match nondeterministic_locale {
            None => Comparison::PadSpace,
            Some(locale) => Comparison::Unmatched(format!(
                "{declared} ignores trailing spaces, and its collation {locale} more"
            )),
        },
        "name" => Comparison::Unmatched(format!(
            "{declared} truncates what it is compared with to 63 bytes"
        )),
        "text" | "varchar" => match nondeterministic_locale {
            None => Comparison::Exact,
            Some(locale) => icu_comparison(locale),
        },
        _ if is_enum => Comparison::Exact,
        _ => Comparison::Unmatched(format!("{declared} is parsed, not compared as text")),
    }
}

/// A nondeterministic ICU collation's comparison, from its locale
/// (`und-u-ks-level2`, or the older `@colStrength=secondary`).
#[cfg(any(feature = "postgres", test))]
fn icu_comparison(locale: &str) -> Comparison {
    let locale = locale.to_ascii_lowercase();
    let has = |needle: &str| locale.contains(needle);
    if has("kn-true") || has("colnumeric=yes") {
        return Comparison::Unmatched(format!(
            "collation {locale} compares digits as numbers (007 is 7)"
        ));
    }
    if has("ka-shifted") || has("alternate=shifted") {
        return Comparison::Unmatched(format!("collation {locale} ignores punctuation and spaces"));
    }
    if has("ks-level1") || has("colstrength=primary") {
        return Comparison::Unmatched(format!("collation {locale} ignores accents"));
    }
    if has("ks-level2") || has("colstrength=secondary") {
        return Comparison::CaseInsensitive;
    }
    Comparison::IgnoresCharacters
}

/// A SQLite column's comparison, from its declared type and its
/// definition (`key text collate nocase`), by SQLite's affinity rules.
#[cfg(any(feature = "sqlite", test))]
pub(crate) fn sqlite_comparison(declared: &str, definition: &str) -> Comparison {
    let declared = declared.to_ascii_uppercase();
    if declared.contains("INT") {
        return Comparison::Integer;
    }
    let text = declared.contains("CHAR") || declared.contains("CLOB") || declared.contains("TEXT");
    let blob = declared.is_empty() || declared.contains("BLOB");
    if !text && !blob {
        return Comparison::Unmatched(format!(
            "{declared} has numeric affinity: `7.0` is found by `7`"
        ));
    }
    let definition = definition.to_ascii_lowercase();
    let collation = definition
        .split_whitespace()
        .skip_while(|word| *word != "collate")
        .nth(1)
        .map(|name| name.trim_matches(|c: char| !c.is_ascii_alphanumeric()));
    match collation {
        Some("nocase") => Comparison::AsciiCaseInsensitive,
        Some("rtrim") => Comparison::PadSpace,
        Some("binary") | None => Comparison::Exact,
        Some(other) => Comparison::Unmatched(format!("COLLATE {other} is the application's own")),
    }
}

/// The definition of `column` in a SQLite `CREATE TABLE` statement: the
/// text from the column's name to the next comma outside parentheses.
#[cfg(any(feature = "sqlite", test))]
pub(crate) fn sqlite_column_definition<'s>(create: &'s str, column: &str) -> Option<&'s str> {
    let body = &create[create.find('(')? + 1..];
    let mut depth = 0_usize;
    let mut start = 0;
    let mut definitions = Vec::new();
    for (at, c) in body.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                definitions.push(&body[start..at]);
                break;
            }
            ')' => depth -= 1,
            ',' if depth == 0 => {
                definitions.push(&body[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    definitions.into_iter().map(str::trim).find(|definition| {
        let name = definition
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_matches(|c| matches!(c, '"' | '`' | '[' | ']'));
        name.eq_ignore_ascii_case(column)
    })
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

    #[test]
    fn postgres_types_and_collations() {
        assert_eq!(
            postgres_comparison("int8", false, "bigint", None, true),
            Comparison::Integer
        );
        assert_eq!(
            postgres_comparison("uuid", false, "uuid", None, true),
            Comparison::Uuid
        );
        assert_eq!(
            postgres_comparison("citext", false, "citext", None, true),
            Comparison::Lowered
        );
        assert_eq!(
            postgres_comparison("citext", false, "citext", None, false),
            Comparison::CaseInsensitive
        );
        assert_eq!(
            postgres_comparison("varchar", false, "character varying(20)", None, true),
            Comparison::Exact
        );
        assert_eq!(
            postgres_comparison("mood", true, "mood", None, true),
            Comparison::Exact
        );
        assert_eq!(
            postgres_comparison("bpchar", false, "character(8)", None, true),
            Comparison::PadSpace
        );
        assert!(matches!(
            postgres_comparison("numeric", false, "numeric", None, true),
            Comparison::Unmatched(_)
        ));
        let icu = |locale| postgres_comparison("text", false, "text", Some(locale), true);
        assert_eq!(icu("und-u-ks-level2"), Comparison::CaseInsensitive);
        assert_eq!(icu("@colStrength=secondary"), Comparison::CaseInsensitive);
        assert_eq!(icu("und-u-ks-level3"), Comparison::IgnoresCharacters);
        assert!(matches!(icu("und-u-ks-level1"), Comparison::Unmatched(_)));
        assert!(matches!(icu("und-u-ka-shifted"), Comparison::Unmatched(_)));
        assert!(matches!(icu("und-u-kn-true"), Comparison::Unmatched(_)));
        assert!(matches!(
            icu("und-u-ks-level2-kn-true"),
            Comparison::Unmatched(_)
        ));
        assert!(matches!(
            postgres_comparison("name", false, "name", None, true),
            Comparison::Unmatched(_)
        ));
    }

    #[test]
    fn sqlite_affinities_and_collations() {
        let create = r#"CREATE TABLE "items" (id integer primary key, "key" text not null collate NOCASE unique, n numeric(10, 2), b)"#;
        let key = sqlite_column_definition(create, "key").expect("found");
        assert_eq!(
            sqlite_comparison("text", key),
            Comparison::AsciiCaseInsensitive
        );
        assert_eq!(
            sqlite_column_definition(create, "n"),
            Some("n numeric(10, 2)")
        );
        assert!(matches!(
            sqlite_comparison("numeric(10, 2)", "n numeric(10, 2)"),
            Comparison::Unmatched(_)
        ));
        assert_eq!(sqlite_comparison("", "b"), Comparison::Exact);
        assert_eq!(
            sqlite_comparison("INTEGER", "id integer primary key"),
            Comparison::Integer
        );
        assert_eq!(
            sqlite_comparison("varchar(20)", "k varchar(20) collate binary"),
            Comparison::Exact
        );
        assert_eq!(
            sqlite_comparison("text", "k text collate rtrim"),
            Comparison::PadSpace
        );
    }
}
