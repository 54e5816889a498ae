//! Reading the SQLite change feed by row id (SQLite commits one writer at
//! a time, so row ids follow commit order), pruning it, checking its
//! triggers and the key columns.

use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::{Row, SqlitePool};

use super::install::ident;
use super::scan::key_bytes;
use crate::changes::Changes;
use crate::column::{sqlite_column_definition, sqlite_comparison, KeyColumn};
use crate::follow::Read;
use crate::watch::Watch;

/// The feed's position now: its last row id.
pub(super) async fn position(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("select coalesce(max(id), 0) from bloom_guard_changes")
        .fetch_one(pool)
        .await
}

/// Reads the changes of feed `name` after `position`.
pub(super) async fn read_since(
    pool: &SqlitePool,
    name: &str,
    position: i64,
) -> Result<Read<i64>, sqlx::Error> {
    let mut rows = sqlx::query(
        "select id, kind, key from bloom_guard_changes where guard = ? and id > ? order by id",
    )
    .bind(name)
    .bind(position)
    .fetch(pool);
    let mut changes = Changes::default();
    let mut reached = position;
    while let Some(row) = rows.try_next().await? {
        reached = row.try_get(0)?;
        let kind: String = row.try_get(1)?;
        changes.record(&kind, key_bytes(row.try_get_raw(2)?)?);
    }
    drop(rows);
    // After the rows: pruning moves the horizon before it deletes, so a
    // read that lost rows to it sees the new horizon here.
    let below: i64 = sqlx::query_scalar("select below from bloom_guard_horizon")
        .fetch_one(pool)
        .await?;
    if position + 1 < below {
        return Ok(Read::Pruned);
    }
    Ok(Read::Changes {
        position: reached,
        changes,
    })
}

/// Counts the rows of feed `name` after `position`, up to `limit`.
pub(super) async fn pending(
    pool: &SqlitePool,
    name: &str,
    position: i64,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(
        "select count(*) from (
            select 1 from bloom_guard_changes where guard = ? and id > ? limit ?)",
    )
    .bind(name)
    .bind(position)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_one(pool)
    .await?;
    Ok(count.max(0) as u64)
}

/// Moves the horizon past the rows older than the retention, then deletes
/// them; how many.
pub(super) async fn prune(pool: &SqlitePool, retention: Duration) -> Result<i64, sqlx::Error> {
    sqlx::query(
        "update bloom_guard_horizon set below = max(below, coalesce(
            (select max(id) + 1 from bloom_guard_changes where at < cast(strftime('%s', 'now') as integer) - ?), 0))",
    )
    .bind(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX))
    .execute(pool)
    .await?;
    let deleted = sqlx::query(
        "delete from bloom_guard_changes where id < (select below from bloom_guard_horizon)",
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(i64::try_from(deleted).unwrap_or(i64::MAX))
}

/// The triggers `Watch::install_sqlite` puts on the watched table, by name.
pub(super) fn trigger_names(watch: &Watch) -> [String; 3] {
    ["inserted", "updated", "deleted"]
        .map(|event| format!("bloom_guard_{}_{event}", watch.feed_name()))
}

/// What keeps the feed from being complete: the feed not installed, or a
/// trigger missing from the watched table (a table rebuilt the SQLite way
/// drops them). Empty when all is well.
pub(super) async fn gaps(pool: &SqlitePool, watch: &Watch) -> Result<Vec<String>, sqlx::Error> {
    let installed: bool = sqlx::query_scalar(
        "select exists(select 1 from sqlite_master where type = 'table' and name = 'bloom_guard_changes')",
    )
    .fetch_one(pool)
    .await?;
    if !installed {
        return Ok(vec![
            "the change feed is not installed: call Watch::install_sqlite".to_owned(),
        ]);
    }
    let table = unquoted(&watch.table);
    let present: Vec<String> = sqlx::query_scalar(
        "select name from sqlite_master where type = 'trigger' and tbl_name = ? collate nocase",
    )
    .bind(table)
    .fetch_all(pool)
    .await?;
    Ok(trigger_names(watch)
        .into_iter()
        .filter(|name| !present.contains(name))
        .map(|name| format!("{}: trigger {} is missing", ident(table), name))
        .collect())
}

/// The watched key columns, in the watch's order.
pub(super) async fn key_columns(
    pool: &SqlitePool,
    watch: &Watch,
) -> Result<Vec<KeyColumn>, sqlx::Error> {
    let table = unquoted(&watch.table);
    let create: Option<String> =
        sqlx::query_scalar("select sql from sqlite_master where type = 'table' and name = ?")
            .bind(table)
            .fetch_optional(pool)
            .await?;
    let create = create.unwrap_or_default();
    let types: Vec<(String, String)> =
        sqlx::query_as("select name, type from pragma_table_info(?)")
            .bind(table)
            .fetch_all(pool)
            .await?;
    Ok(watch
        .key_columns
        .iter()
        .filter_map(|column| {
            let (name, declared) = types
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(column))?;
            let definition = sqlite_column_definition(&create, name).unwrap_or_default();
            Some(KeyColumn {
                name: name.clone(),
                comparison: sqlite_comparison(declared, definition),
            })
        })
        .collect())
}

/// A table's name without the quotes SQL may give it.
fn unquoted(table: &str) -> &str {
    table.trim_matches(|c| matches!(c, '"' | '`' | '[' | ']'))
}
