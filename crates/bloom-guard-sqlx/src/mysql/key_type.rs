//! A watched MySQL table's key columns and how the server compares them.

use bloom_guard::KeyType;
use sqlx::MySqlPool;

use super::names::located;
use crate::error::FeedError;
use crate::follow::column::{key_type_for, Comparison, KeyColumn};
use crate::watch::Watch;

impl Watch {
    /// The key type a guard over this table needs on MySQL or MariaDB,
    /// from its key column's type and collation: `Integer`, `Uuid`,
    /// `SpacePaddedText` for a PAD SPACE binary collation, `Text`, and for
    /// a case- or accent-insensitive collation ( `utf8mb4_general_ci`,
    /// MariaDB's default; `utf8mb4_unicode_ci`; `utf8mb4_uca1400_ai_ci`;
    /// MySQL 8's `utf8mb4_0900_ai_ci`) [`KeyType::Collated`], with the
    /// collation's weights read from the server (one statement, once per
    /// process). Composite keys are `Text`.
    ///
    /// # Errors
    ///
    /// [`FeedError::Uncomparable`] for a column no key type compares as the
    /// server does (a language's collation, MySQL 8's accent-sensitive
    /// ones), naming the collations supported; [`FeedError::Database`] if the table
    /// cannot be read or lacks a key column.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard::BloomGuard;
    /// use bloom_guard_sqlx::{mysql, Watch};
    ///
    /// # async fn run(pool: sqlx::MySqlPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// let items = Watch::table("items").key("key");
    /// items.install(&pool).await?;
    /// // `key varchar(255)` under utf8mb4_general_ci: `Apple-Pie` is found
    /// // as `apple-pie`, and the guard looks keys up as the server does.
    /// let guard = BloomGuard::builder()
    ///     .key_type(items.key_type(&pool).await?)
    ///     .build();
    /// tokio::spawn(mysql::Follower::new(guard.clone(), pool, items).run());
    /// # Ok(()) }
    /// ```
    pub(crate) async fn key_type_mysql(&self, pool: &MySqlPool) -> Result<KeyType, FeedError> {
        let columns = key_columns(pool, self).await?;
        match key_type_for(&self.table, &columns, self.key_columns.len())? {
            Ok(key_type) => Ok(key_type),
            Err(collation) => super::collation::key_type(pool, &collation).await,
        }
    }
}

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
        (_, true, "char") => Comparison::Unmatched(
            "a char column pads its values with spaces, which its NO PAD collation compares; use varchar".to_owned(),
        ),
        (false, _, "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "char")
            if super::collation::is_supported(&collation) =>
        {
            Comparison::Collated(collation)
        }
        _ => Comparison::Unmatched(format!(
            "its collation {collation} equates spellings no key type reproduces; use one of {} (KeyType::Collated), a NO PAD binary collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL) or varbinary",
            super::collation::supported_list()
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
        for collation in ["utf8mb4_general_ci", "utf8mb4_0900_ai_ci"] {
            assert_eq!(
                comparison("varchar", Some(collation)),
                Comparison::Collated(collation.to_owned())
            );
        }
        for (data_type, collation) in [
            ("varchar", Some("utf8mb4_german2_ci")),
            ("varchar", Some("utf8mb4_0900_as_ci")),
            ("char", Some("utf8mb4_general_nopad_ci")),
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
