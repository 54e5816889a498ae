//! How the MySQL code writes names and bytes into SQL.

use crate::watch::Watch;

/// `` `name` `` with inner backquotes doubled: a MySQL identifier.
pub(super) fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A MySQL string literal of `text`, read alike under any `sql_mode`
/// (`NO_BACKSLASH_ESCAPES` changes what a backslash means): `'text'`, or
/// its UTF-8 bytes in hex where it holds a quote or a backslash.
pub(super) fn literal(text: &str) -> String {
    if text.contains(['\\', '\'']) {
        let hex: String = text.bytes().map(|byte| format!("{byte:02x}")).collect();
        format!("convert(x'{hex}' using utf8mb4)")
    } else {
        format!("'{text}'")
    }
}

/// A watched table's schema, if named (`shop.orders`), and name, without
/// the backquotes SQL may give them.
pub(super) fn table_parts(table: &str) -> (Option<String>, String) {
    let unquoted = |part: &str| part.trim_matches('`').to_owned();
    match table.split_once('.') {
        Some((schema, name)) if !table.starts_with('`') || schema.ends_with('`') => {
            (Some(unquoted(schema)), unquoted(name))
        }
        _ => (None, unquoted(table)),
    }
}

/// The watched table as SQL names it.
pub(super) fn table_ident(table: &str) -> String {
    match table_parts(table) {
        (Some(schema), name) => format!("{}.{}", ident(&schema), ident(&name)),
        (None, name) => ident(&name),
    }
}

/// Bytes as lower-case hex digits.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The watched table's schema, if the watch names one (else the
/// connection's database: queries ask `coalesce(?, database())`), and
/// its name.
pub(super) fn located(watch: &Watch) -> (Option<String>, String) {
    table_parts(&watch.table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_split_into_schema_and_table() {
        assert_eq!(table_parts("items"), (None, "items".to_owned()));
        assert_eq!(
            table_parts("shop.orders"),
            (Some("shop".to_owned()), "orders".to_owned())
        );
        assert_eq!(
            table_parts("`shop`.`orders`"),
            (Some("shop".to_owned()), "orders".to_owned())
        );
        assert_eq!(table_parts("`a.b`"), (None, "a.b".to_owned()));
        assert_eq!(ident("we`ird"), "`we``ird`");
        assert_eq!(literal("items"), "'items'");
        assert_eq!(literal(r"it's \"), "convert(x'69742773205c' using utf8mb4)");
    }
}
