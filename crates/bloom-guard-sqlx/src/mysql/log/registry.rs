//! The tables on the binary log feed, as `bloom_guard_log_tables` lists
//! them: whether a table is on it (the trigger install refuses it), and
//! each one's key columns' places in the rows (the producer's).

use sqlx::MySqlPool;

use super::rows::KeyPart;
use super::stream::{FeedId, LoggedTable, LoggedTables};
use crate::mysql::names::ident;
use crate::watch::Watch;

/// Whether `watch`'s table is on the binary log feed.
pub(crate) async fn is_logged(pool: &MySqlPool, watch: &Watch) -> Result<bool, sqlx::Error> {
    let found =
        sqlx::query_scalar::<_, i64>("select count(*) from bloom_guard_log_tables where guard = ?")
            .bind(watch.feed_name())
            .fetch_one(pool)
            .await;
    match found {
        Ok(found) => Ok(found > 0),
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42S02") => Ok(false),
        Err(error) => Err(error),
    }
}

/// Adds the tables on `database`'s feed to `tables`, with their key
/// columns' places in the rows as the server's catalog says now; whether
/// the connection sees every one of them (a role without rights on a table
/// sees no column of it, nor does anyone of a table dropped).
pub(crate) async fn add_logged_tables(
    connection: &mut sqlx::MySqlConnection,
    database: &str,
    tables: &mut LoggedTables,
) -> Result<bool, sqlx::Error> {
    let registered: Vec<(String, String, String, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select guard, table_schema, table_name, key_columns from {}.bloom_guard_log_tables",
            ident(database)
        )))
        .fetch_all(&mut *connection)
        .await?;
    add_tables(connection, database, registered, tables).await
}

/// Adds `database`'s `registered` tables, as its registry lists them.
async fn add_tables(
    connection: &mut sqlx::MySqlConnection,
    database: &str,
    registered: Vec<(String, String, String, String)>,
    tables: &mut LoggedTables,
) -> Result<bool, sqlx::Error> {
    let mut all_seen = true;
    for (feed, schema, table, keys) in registered {
        let keys: Vec<String> = serde_json::from_str(&keys).unwrap_or_default();
        let columns: Vec<(String, i64, String)> = sqlx::query_as(
            "select cast(column_name as char), cast(ordinal_position as signed), cast(column_type as char)
               from information_schema.columns where table_schema = ? and table_name = ?",
        )
        .bind(&schema)
        .bind(&table)
        .fetch_all(&mut *connection)
        .await?;
        all_seen &= !columns.is_empty();
        let parts: Option<Vec<KeyPart>> = keys
            .iter()
            .map(|key| {
                let (name, position, column_type) = columns
                    .iter()
                    .find(|(name, ..)| name.eq_ignore_ascii_case(key))?;
                Some(KeyPart {
                    name: name.clone(),
                    index: usize::try_from(*position - 1).ok()?,
                    unsigned: column_type.to_ascii_lowercase().contains("unsigned"),
                })
            })
            .collect();
        // A table or key column gone: its DDL reached the log too, and
        // started its guards over; nothing of it is read until it is back.
        if let Some(parts) = parts.filter(|parts| !parts.is_empty()) {
            tables.insert(
                &schema,
                &table,
                LoggedTable {
                    feed: FeedId {
                        database: database.to_owned(),
                        feed,
                    },
                    parts,
                    columns: columns.len(),
                },
            );
        }
    }
    Ok(all_seen)
}
