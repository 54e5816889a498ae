//! Reading the SQLite change feed by row id (SQLite commits one writer at
//! a time, so row ids follow commit order), pruning it, checking its
//! triggers and the key columns.

use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, Row, SqlitePool, TypeInfo, ValueRef};

use super::names::ident;
use super::position::Mark;
use crate::follow::changes::Changes;
use crate::follow::column::KeyColumn;
use crate::follow::dialects::{sqlite_column_definition, sqlite_comparison};
use crate::follow::Read;
use crate::watch::Watch;

/// A feed row's columns as a position's digest covers them: the key as the
/// hex of its SQL literal, ASCII whatever the key's bytes.
const MARKED: &str = "id, guard, kind, hex(quote(key)), at";

/// The mark of row `id`, if the feed holds it.
async fn mark_of(db: impl sqlx::SqliteExecutor<'_>, id: i64) -> Result<Option<Mark>, sqlx::Error> {
    let row: Option<(i64, String, String, String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "select {MARKED} from bloom_guard_changes where id = ?"
    )))
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(id, guard, kind, key, at)| Mark::at(id, &guard, &kind, &key, at)))
}

/// The feed's position now: its last row.
pub(super) async fn position(pool: &SqlitePool) -> Result<Mark, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    position_in(&mut conn).await
}

/// A stored key's bytes: `None` for a BLOB, which no request can name,
/// and for NULL.
pub(super) fn key_bytes<'r>(
    value: sqlx::sqlite::SqliteValueRef<'r>,
) -> Result<Option<&'r [u8]>, sqlx::Error> {
    if value.is_null() || value.type_info().name() == "BLOB" {
        return Ok(None);
    }
    <&[u8] as sqlx::Decode<'_, sqlx::Sqlite>>::decode(value)
        .map(Some)
        .map_err(sqlx::Error::Decode)
}

/// The feed's position as `conn` sees it (in a transaction: as of its
/// snapshot).
pub(super) async fn position_in(conn: &mut sqlx::SqliteConnection) -> Result<Mark, sqlx::Error> {
    let last: i64 = sqlx::query_scalar("select coalesce(max(id), 0) from bloom_guard_changes")
        .fetch_one(&mut *conn)
        .await?;
    Ok(mark_of(&mut *conn, last).await?.unwrap_or(Mark::START))
}

/// The changes after a position, the pruning horizon and the row at the
/// position, in one statement: one snapshot, one step on the pool's
/// connection. A read that lost rows to pruning sees the horizon it moved
/// (pruning moves the horizon before it deletes). `?1` the feed, `?2` the
/// position's id; the first row carries the horizon and the mark's row,
/// and a read that found nothing is that row alone.
const READ: &str = "
with now as (select coalesce(max(below), 0) as below from bloom_guard_horizon)
select now.below,
       m.id, m.guard, m.kind, hex(quote(m.key)), m.at,
       c.id, c.kind, hex(quote(c.key)), c.at, c.key
from now
left join bloom_guard_changes m on m.id = ?2
left join bloom_guard_changes c on c.guard = ?1 and c.id > ?2
order by c.id";

/// Reads the changes of feed `name` after `position`.
pub(super) async fn read_since(
    pool: &SqlitePool,
    name: &str,
    position: &Mark,
) -> Result<Read<Mark>, sqlx::Error> {
    let mut rows = sqlx::query(READ).bind(name).bind(position.id).fetch(pool);
    let mut changes = Changes::default();
    let mut reached = position.clone();
    let mut first = true;
    while let Some(row) = rows.try_next().await? {
        if first {
            first = false;
            let below: i64 = row.try_get(0)?;
            if position.id + 1 < below {
                return Ok(Read::Pruned);
            }
            // The row at the position must still be the one it was taken
            // at, or gone by pruning: otherwise the feed was rewritten under
            // the reader (a restore), and rows it never read may hold ids
            // it has passed.
            if position.id > 0 {
                let now = row
                    .try_get::<Option<i64>, _>(1)?
                    .map(|id| -> Result<Mark, sqlx::Error> {
                        Ok(Mark::at(
                            id,
                            &row.try_get::<String, _>(2)?,
                            &row.try_get::<String, _>(3)?,
                            &row.try_get::<String, _>(4)?,
                            row.try_get(5)?,
                        ))
                    })
                    .transpose()?;
                match now {
                    Some(now) if now == *position => {}
                    None if position.id < below => {}
                    _ => return Ok(Read::Pruned),
                }
            }
        }
        let Some(id) = row.try_get::<Option<i64>, _>(6)? else {
            continue; // the one row of a read that found nothing
        };
        let (kind, quoted, at): (String, String, i64) =
            (row.try_get(7)?, row.try_get(8)?, row.try_get(9)?);
        changes.record(&kind, key_bytes(row.try_get_raw(10)?)?);
        reached = Mark::at(id, name, &kind, &quoted, at);
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
    position: &Mark,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(
        "select count(*) from (
            select 1 from bloom_guard_changes where guard = ? and id > ? limit ?)",
    )
    .bind(name)
    .bind(position.id)
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

/// The triggers `Watch::install` puts on the watched table, by name.
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
            "the change feed is not installed: call Watch::install".to_owned(),
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

/// Whether the watched table has every key column.
pub(super) async fn has_key_columns(pool: &SqlitePool, watch: &Watch) -> Result<bool, sqlx::Error> {
    let columns: Vec<String> = sqlx::query_scalar("select name from pragma_table_info(?)")
        .bind(unquoted(&watch.table))
        .fetch_all(pool)
        .await?;
    Ok(watch.key_columns.iter().all(|key| {
        columns
            .iter()
            .any(|column| column.eq_ignore_ascii_case(key))
    }))
}

/// Records that writes bypassed feed `name`: every reader rebuilds.
pub(super) async fn record_resync(pool: &SqlitePool, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("insert into bloom_guard_changes (guard, kind, key) values (?, 'r', '')")
        .bind(name)
        .execute(pool)
        .await?;
    Ok(())
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
