//! Removing the change feed from MySQL or MariaDB, and the lock wait every
//! statement of ours that locks a user's table runs under.

use sqlx::mysql::MySqlDatabaseError;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql, MySqlPool};

use super::catalog;
use super::names::{ident, table_parts};
use crate::error::FeedError;
use crate::watch::Watch;

/// How long a statement of ours that locks a user's table (the triggers'
/// DDL) waits for its metadata lock, as `lock_wait_timeout` (MySQL's
/// default is a year): writers queue behind a DDL that waits, and no
/// longer than this. Tried again until the transaction in its way ends.
pub(super) const DDL_LOCK_WAIT: &str = "1 s";

/// A connection of `pool` for DDL on a user's table, waiting at most
/// [`DDL_LOCK_WAIT`] for a lock; closed after use, so its setting never
/// reaches the pool.
pub(super) async fn ddl_connection(pool: &MySqlPool) -> Result<PoolConnection<MySql>, sqlx::Error> {
    let mut connection = pool.acquire().await?;
    connection.close_on_drop();
    sqlx::raw_sql("set session lock_wait_timeout = 1")
        .execute(&mut *connection)
        .await?;
    Ok(connection)
}

/// A lock not granted within the wait (error 1205).
pub(super) fn lock_wait_timed_out(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Database(error)
            if error.try_downcast_ref::<MySqlDatabaseError>().map(MySqlDatabaseError::number) == Some(1205)
    )
}

/// The feed's, the snapshots' and the fleet's tables, in the order they
/// can be dropped.
pub(super) const TABLE_NAMES: [&str; 7] = [
    "bloom_guard_snapshot_chunks",
    "bloom_guard_snapshots",
    "bloom_guard_changes",
    "bloom_guard_horizon",
    "bloom_guard_settings",
    "bloom_guard_instances",
    "bloom_guard_identity",
];

/// Removes the change feed from a MySQL or MariaDB database: every feed
/// trigger of the database's tables, then the feed's, snapshots' and
/// fleet's tables. Stop the followers first: a running one puts its
/// table's triggers back at its next check. Each trigger's DDL waits at
/// most a second for its table's lock, and is tried again until the
/// transaction in its way ends.
///
/// # Errors
///
/// [`FeedError::Database`] if the database refuses the DDL (the `TRIGGER`
/// and `DROP` privileges are needed).
///
/// # Example
///
/// ```no_run
/// # async fn run(pool: sqlx::MySqlPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// bloom_guard_sqlx::mysql::uninstall(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn uninstall(pool: &MySqlPool) -> Result<(), FeedError> {
    let triggers: Vec<String> = sqlx::query_scalar(
        "select cast(trigger_name as char) from information_schema.triggers
          where trigger_schema = database() and trigger_name like 'bloom\\_guard\\_%'",
    )
    .fetch_all(pool)
    .await?;
    drop_triggers(pool, None, &triggers).await?;
    let tables: Vec<String> = TABLE_NAMES.iter().map(|table| ident(table)).collect();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "drop table if exists {}",
        tables.join(", ")
    )))
    .execute(pool)
    .await?;
    tracing::info!("removed the bloom-guard change feed");
    Ok(())
}

/// Drops `triggers` (in `schema`, or the connection's database), each
/// under the DDL lock wait, retried.
async fn drop_triggers(
    pool: &MySqlPool,
    schema: Option<&str>,
    triggers: &[String],
) -> Result<(), sqlx::Error> {
    crate::ddl::retrying_locks("unwatch", DDL_LOCK_WAIT, lock_wait_timed_out, || async {
        let mut ddl = ddl_connection(pool).await?;
        for trigger in triggers {
            let qualified = match schema {
                Some(schema) => format!("{}.{}", ident(schema), ident(trigger)),
                None => ident(trigger),
            };
            sqlx::raw_sql(AssertSqlSafe(format!("drop trigger if exists {qualified}")))
                .execute(&mut *ddl)
                .await?;
        }
        Ok(())
    })
    .await
}

impl Watch {
    /// Stops recording this table's keys: drops the feed's triggers from
    /// it, each waiting at most a second for the table's lock and tried
    /// again until the transaction in its way ends. A follower of the
    /// guard that still runs puts them back at its next check (it repairs
    /// a table swapped without them): stop it first.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the database refuses the DDL.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::MySqlPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// bloom_guard_sqlx::Watch::table("items").key("key").uninstall(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub(crate) async fn uninstall_mysql(&self, pool: &MySqlPool) -> Result<(), FeedError> {
        let triggers: Vec<String> = self
            .mysql_triggers(&vec![false; self.key_columns.len()])
            .iter()
            .map(|(event, _, _)| catalog::trigger_name(self, event))
            .collect();
        let (schema, _) = table_parts(&self.table);
        drop_triggers(pool, schema.as_deref(), &triggers).await?;
        Ok(())
    }
}
