//! A watched MySQL table's key columns and how the server compares them.

use sqlx::MySqlPool;

use super::names::located;
use crate::follow::column::{Comparison, KeyColumn};
use crate::watch::Watch;

/// Whether the watched table has every key column.
pub(super) async fn has_key_columns(pool: &MySqlPool, watch: &Watch) -> Result<bool, sqlx::Error> {
    let columns = columns(pool, watch).await?;
    Ok(watch.key_columns.iter().all(|key| {
        columns
            .iter()
            .any(|(column, ..)| column.eq_ignore_ascii_case(key))
    }))
}

/// The watched table's columns: name, data type, collation (none for
/// numbers and binary strings).
pub(super) async fn columns(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Vec<(String, String, Option<String>)>, sqlx::Error> {
    let (schema, table) = located(watch);
    sqlx::query_as(
        "select cast(column_name as char), cast(data_type as char), cast(collation_name as char)
           from information_schema.columns
          where table_schema = coalesce(?, database()) and table_name = ?
          order by ordinal_position",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
}

/// The watched key columns, in the watch's order.
pub(super) async fn key_columns(
    pool: &MySqlPool,
    watch: &Watch,
) -> Result<Vec<KeyColumn>, sqlx::Error> {
    let columns = columns(pool, watch).await?;
    Ok(watch
        .key_columns
        .iter()
        .filter_map(|key| {
            let (name, data_type, collation) = columns
                .iter()
                .find(|(name, ..)| name.eq_ignore_ascii_case(key))?;
            Some(KeyColumn {
                name: name.clone(),
                comparison: comparison(data_type, collation.as_deref()),
            })
        })
        .collect())
}

/// How MySQL compares a key column of `data_type` under `collation`.
pub(super) fn comparison(data_type: &str, collation: Option<&str>) -> Comparison {
    let data_type = data_type.to_ascii_lowercase();
    match data_type.as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => {
            return Comparison::Integer
        }
        "uuid" => return Comparison::Uuid,
        // Bytes as they are; `binary(n)` pads with zero bytes, which no
        // request carries.
        "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => return Comparison::Exact,
        _ => {}
    }
    let Some(collation) = collation.map(str::to_ascii_lowercase) else {
        return Comparison::Unmatched(format!(
            "a {data_type} column compares its values, not their text"
        ));
    };
    let no_pad = collation.contains("nopad") || collation.contains("0900");
    let binary = collation.ends_with("_bin") || collation == "binary";
    match (binary, no_pad, data_type.as_str()) {
        (true, true, "varchar" | "tinytext" | "text" | "mediumtext" | "longtext") => {
            Comparison::Exact
        }
        // `abc ` finds `abc`: trailing spaces are ignored, and a char
        // column's padding is stripped when it is read.
        (true, false, "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "char") => {
            Comparison::PadSpace
        }
        (true, true, "char") => Comparison::Unmatched(
            "a char column pads its values with spaces, which its NO PAD collation compares; use varchar".to_owned(),
        ),
        _ => Comparison::Unmatched(format!(
            "its collation {collation} equates spellings no key type reproduces (case, accents, trailing spaces); use a NO PAD binary collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL) or varbinary"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_byte_exact_columns_compare_as_text() {
        assert_eq!(comparison("bigint", None), Comparison::Integer);
        assert_eq!(comparison("varbinary", None), Comparison::Exact);
        assert_eq!(
            comparison("varchar", Some("utf8mb4_nopad_bin")),
            Comparison::Exact
        );
        assert_eq!(
            comparison("VARCHAR", Some("utf8mb4_0900_bin")),
            Comparison::Exact
        );
        for (data_type, collation) in [("varchar", "utf8mb4_bin"), ("char", "utf8mb4_bin")] {
            assert_eq!(
                comparison(data_type, Some(collation)),
                Comparison::PadSpace,
                "{data_type} {collation}"
            );
        }
        for (data_type, collation) in [
            ("varchar", Some("utf8mb4_general_ci")),
            ("varchar", Some("utf8mb4_0900_ai_ci")),
            ("char", Some("utf8mb4_nopad_bin")),
            ("date", None),
        ] {
            assert!(
                matches!(comparison(data_type, collation), Comparison::Unmatched(_)),
                "{data_type} {collation:?}"
            );
        }
    }
}
