//! The log feed's side of the writers' and propagation benchmarks:
//! `items_log`, a twin of `items` on the log feed, and the slot's reader
//! waited for.

use std::time::{Duration, Instant};

use bloom_guard_sqlx::Watch;
use sqlx::PgPool;

/// How long the log feed's slot of the pool's database takes to confirm
/// the log flushed now (within a page: a flush can end inside a record
/// that goes on).
pub(crate) async fn catch_up(pool: &PgPool) -> Result<Duration, sqlx::Error> {
    let started = Instant::now();
    let target: String = sqlx::query_scalar("select pg_current_wal_flush_lsn()::text")
        .fetch_one(pool)
        .await?;
    while started.elapsed() < Duration::from_secs(60) {
        let behind: bool = sqlx::query_scalar(
            "select coalesce(bool_or(confirmed_flush_lsn < $1::pg_lsn - 8192), true)
               from pg_replication_slots
              where slot_name like 'bloom\\_guard\\_%' and not temporary
                and database = current_database()",
        )
        .bind(&target)
        .fetch_one(pool)
        .await?;
        if !behind {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(started.elapsed())
}

/// Waits until no instance streams the log feed's slot.
pub(crate) async fn until_unread(pool: &PgPool) -> Result<(), sqlx::Error> {
    for _ in 0..1000 {
        let active: bool = sqlx::query_scalar(
            "select coalesce(bool_or(active), false) from pg_replication_slots
              where slot_name like 'bloom\\_guard\\_%' and not temporary
                and database = current_database()",
        )
        .fetch_one(pool)
        .await?;
        if !active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// `items_log`, another twin of `items`, put on the log feed with `rows`
/// rows, if the server decodes its log; whether it did.
pub(crate) async fn log_twin(pool: &PgPool, rows: i64) -> Result<bool, Box<dyn std::error::Error>> {
    let level: String = sqlx::query_scalar("show wal_level").fetch_one(pool).await?;
    if level != "logical" {
        return Ok(false);
    }
    sqlx::raw_sql(
        "create table items_log (like items including all);
         alter table items_log replica identity using index items_log_key_key;",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "insert into items_log (key) select 'row-' || g from generate_series(1::bigint, $1) g",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    Watch::table("items_log")
        .key("key")
        .install_log(pool)
        .await?;
    sqlx::raw_sql("vacuum analyze items_log")
        .execute(pool)
        .await?;
    Ok(true)
}
