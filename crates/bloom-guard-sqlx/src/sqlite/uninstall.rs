//! Removing the feed from a SQLite database: its tables and triggers.

use sqlx::{AssertSqlSafe, SqlitePool};

use super::names::ident;
use crate::error::FeedError;

/// Removes the change feed from a SQLite database: every feed trigger on
/// every table, and the feed's, snapshots' and fleet's tables (every
/// object named `bloom_guard_*`), in one transaction. Stop the followers
/// first: a running one puts its table's triggers back at its next check.
///
/// # Errors
///
/// [`FeedError::Database`] if the database refuses the DDL.
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// bloom_guard_sqlx::sqlite::uninstall(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn uninstall(pool: &SqlitePool) -> Result<(), FeedError> {
    let mut tx = pool.begin_with("begin immediate").await?;
    // Triggers first: a trigger's table may be dropped after it.
    let objects: Vec<(String, String)> = sqlx::query_as(
        "select type, name from sqlite_master
          where type in ('trigger', 'table') and name like 'bloom\\_guard\\_%' escape '\\'
          order by type = 'table', name",
    )
    .fetch_all(&mut *tx)
    .await?;
    let script: String = objects
        .iter()
        .map(|(kind, name)| format!("drop {kind} if exists {};", ident(name)))
        .collect();
    sqlx::raw_sql(AssertSqlSafe(script))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::info!("removed the bloom-guard change feed");
    Ok(())
}
