//! Installing the change feed's SQL into a Postgres database.

use sqlx::{AssertSqlSafe, PgPool};

use crate::error::FeedError;
use crate::watch::Watch;

/// The version of the feed's schema that this crate installs and reads.
pub const SCHEMA_VERSION: i32 = 7;

/// The feed's SQL: schema `bloom_guard`, its tables, trigger functions and
/// `bloom_guard.watch(table, key_columns, name)`. Idempotent.
pub const POSTGRES_SQL: &str = include_str!("../../sql/postgres.sql");

/// Installs (or upgrades) the change feed in the database: schema
/// `bloom_guard` with the change table and the functions its triggers run.
/// Then [`Watch::install`](crate::Watch::install) puts the triggers on a
/// table.
///
/// Idempotent, and safe to call from every instance at start: it runs in one
/// transaction under an advisory lock, and does nothing when this version
/// (or a newer one, during a rolling upgrade) is installed. The role needs
/// the right to create a schema in the database.
///
/// # Errors
///
/// [`FeedError::Database`] if the database is unreachable or refuses the
/// DDL.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::{install, Watch};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// install(&pool).await?;
/// Watch::table("items").key("key").install(&pool).await?;
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/feed.md")]
pub async fn install(pool: &PgPool) -> Result<(), FeedError> {
    let installed = installed_version(pool).await?;
    if installed.is_some_and(|version| version >= SCHEMA_VERSION) {
        tracing::debug!(?installed, "the change feed is installed");
        return Ok(());
    }
    // One simple-query message: Postgres runs it as one transaction, so a
    // failure leaves nothing half-installed, and the advisory lock makes
    // instances starting together install it one after the other.
    let script = format!(
        "set local client_min_messages = warning;
         select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.install'));
         {POSTGRES_SQL}"
    );
    sqlx::raw_sql(AssertSqlSafe(script)).execute(pool).await?;
    tracing::info!(
        version = SCHEMA_VERSION,
        from = ?installed,
        "installed the bloom-guard change feed"
    );
    Ok(())
}

/// Removes the change feed from the database: schema `bloom_guard` with
/// its tables, functions and snapshots, and (through them) the feed's
/// triggers on every watched table. Followers still running report a gap
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
/// bloom_guard_sqlx::uninstall(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn uninstall(pool: &PgPool) -> Result<(), FeedError> {
    sqlx::raw_sql(
        "set local client_min_messages = warning;
         select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.install'));
         drop schema if exists bloom_guard cascade;",
    )
    .execute(pool)
    .await?;
    tracing::info!("removed the bloom-guard change feed");
    Ok(())
}

/// The feed's schema version in the database, if it is installed.
async fn installed_version(pool: &PgPool) -> Result<Option<i32>, sqlx::Error> {
    let present: bool = sqlx::query_scalar(
        "select pg_catalog.to_regclass('bloom_guard.schema_version') is not null",
    )
    .fetch_one(pool)
    .await?;
    if !present {
        return Ok(None);
    }
    sqlx::query_scalar("select version from bloom_guard.schema_version")
        .fetch_optional(pool)
        .await
}

/// A transaction in which the feed's functions keep their notices (the
/// `drop trigger if exists ..., skipping` of every install) to themselves:
/// a start logs nothing a user would take for a problem.
const QUIET: &str = "begin; set local client_min_messages = warning";

impl Watch {
    /// Installs the feed's triggers on the table and every child and
    /// partition it has (`select bloom_guard.watch(...)`): from then on
    /// every key written by any SQL reaches the feed. Needs
    /// [`install`](crate::install) first and ownership of the table; run it
    /// again after adding a partition or a child table. Idempotent.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`](FeedError::Database) if the table or a column does not exist, the
    /// feed is not installed, or the role does not own the table.
    pub async fn install(&self, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        let mut tx = pool.begin_with(QUIET).await?;
        sqlx::query("select bloom_guard.watch($1::regclass, $2, $3)")
            .bind(&self.table)
            .bind(&self.key_columns)
            .bind(self.feed_name())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Stops recording this table's keys (`select bloom_guard.unwatch(...)`):
    /// drops the feed's triggers from the table and its children and
    /// partitions. A follower of the guard that still runs reports a gap
    /// and lets every request through.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table does not exist, the feed is not
    /// installed, or the role does not own the table.
    pub async fn uninstall(&self, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        let mut tx = pool.begin_with(QUIET).await?;
        sqlx::query("select bloom_guard.unwatch($1::regclass, $2)")
            .bind(&self.table)
            .bind(self.feed_name())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The query whose rows are every key of the table in canonical form,
    /// as the feed's triggers write them.
    pub(super) async fn key_query(&self, pool: &sqlx::PgPool) -> Result<String, sqlx::Error> {
        let (table, key): (String, String) =
            sqlx::query_as("select $1::regclass::text, bloom_guard.key_expression($2, 't')")
                .bind(&self.table)
                .bind(&self.key_columns)
                .fetch_one(pool)
                .await?;
        Ok(format!("select {key} from {table} as t"))
    }
}
