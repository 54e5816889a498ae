//! Removing the feed from a Postgres database: its schema, publication
//! and log slot.

use sqlx::PgPool;

use super::install::{drop_slot, schema_script};
use crate::error::FeedError;

/// Removes the change feed from the database: schema `bloom_guard` with
/// its tables, functions and snapshots, and (through them) the feed's
/// triggers on every watched table; and the log feed's publication and
/// slot, if it had them (stopping the slot's reader). Followers still running report a gap
/// and let every request through. Run it with the feed's owner.
///
/// # Errors
///
/// [`FeedError::Database`] if the database refuses the DDL.
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// bloom_guard_sqlx::postgres::uninstall(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn uninstall(pool: &PgPool) -> Result<(), FeedError> {
    // Under the log feed's slot lock, on a connection of its own (the lock
    // goes with it): a slot made meanwhile would outlive the feed.
    let mut slot_lock = sqlx::ConnectOptions::connect(&*pool.connect_options()).await?;
    sqlx::query("select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.log_slot'))")
        .execute(&mut slot_lock)
        .await?;
    schema_script(
        pool,
        "uninstall",
        "drop schema if exists bloom_guard cascade;
         drop publication if exists bloom_guard;",
    )
    .await?;
    drop_log_slot(pool).await?;
    let _ = sqlx::Connection::close(slot_lock).await;
    tracing::info!("removed the bloom-guard change feed");
    Ok(())
}

/// Drops the database's log feed slot, if there is one: a slot no one
/// reads keeps the server's write-ahead log. Its reader, if any, is
/// stopped first.
async fn drop_log_slot(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut connection = pool.acquire().await?;
    let slot: String = sqlx::query_scalar(
        "select 'bloom_guard_' operator(pg_catalog.||) d.oid::text from pg_catalog.pg_database d
          where d.datname = pg_catalog.current_database()",
    )
    .fetch_one(&mut *connection)
    .await?;
    drop_slot(&mut connection, &slot).await.map(drop)
}
