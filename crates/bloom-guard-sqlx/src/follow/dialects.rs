//! How each database's column types and collations compare keys: the
//! [`Comparison`] of a Postgres column from its catalog, of a SQLite column
//! from its declaration (MySQL's is in its backend).

use super::column::Comparison;

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
