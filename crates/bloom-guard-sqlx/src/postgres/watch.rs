//! Watching and unwatching a Postgres table: the feed's triggers on it,
//! and (feature `log-feed`) its place on the log feed (`log/install.rs`).

use super::install::{retrying_locks, QUIET};
use crate::error::FeedError;
use crate::watch::{sealed, TriggerFeed, Watch};

impl Watch {
    /// Installs the feed's triggers on the table and every child and
    /// partition it has (`select bloom_guard.watch(...)`): from then on
    /// every key written by any SQL reaches the feed. Needs
    /// [`install`](crate::postgres::install) first and ownership of the table; run it
    /// again after adding a partition or a child table. Idempotent.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`](FeedError::Database) if the table or a column does not exist, the
    /// feed is not installed, or the role does not own the table.
    pub(crate) async fn install_postgres(&self, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        if self.is_current(pool).await {
            tracing::debug!(table = %self.table, "the table is watched");
            return Ok(());
        }
        crate::follow::column::comparable(
            &self.table,
            &super::catalog::key_columns(pool, self).await?,
        )?;
        if self.is_log_fed(pool).await? {
            return Err(FeedError::LogFed(self.table.clone()));
        }
        retrying_locks("watch", || self.watch_once(pool)).await?;
        Ok(())
    }

    /// The key type a guard over this table needs, from its key column's
    /// type and collation: `Integer`, `Uuid`, `CaseInsensitiveText` for
    /// `citext` and case-insensitive ICU collations, `SpacePaddedText` for
    /// `char(n)`, `Text` otherwise; composite keys are `Text`.
    ///
    /// # Errors
    ///
    /// [`FeedError::Uncomparable`] for a column no key type compares as
    /// Postgres does (an accent-insensitive collation, a `date`);
    /// [`FeedError::Database`] if the table cannot be read or lacks a key
    /// column.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard::BloomGuard;
    /// use bloom_guard_sqlx::{postgres, Watch};
    ///
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// let users = Watch::table("users").key("email"); // citext
    /// let guard = BloomGuard::builder()
    ///     .key_type(users.key_type(&pool).await?)
    ///     .build();
    /// tokio::spawn(postgres::Follower::new(guard.clone(), pool, users).run());
    /// # Ok(()) }
    /// ```
    pub(crate) async fn key_type_postgres(
        &self,
        pool: &sqlx::PgPool,
    ) -> Result<bloom_guard::KeyType, FeedError> {
        let columns = super::catalog::key_columns(pool, self).await?;
        crate::follow::column::key_type_for(&self.table, &columns, self.key_columns.len())?.map_err(
            |collation| FeedError::Uncomparable(format!("{}: collation {collation}", self.table)),
        )
    }

    /// Whether the log feed feeds the table (for any guard): it has one
    /// feed. False where the log feed was never installed.
    async fn is_log_fed(&self, pool: &sqlx::PgPool) -> Result<bool, sqlx::Error> {
        let installed: bool =
            sqlx::query_scalar("select pg_catalog.to_regclass('bloom_guard.logged') is not null")
                .fetch_one(pool)
                .await?;
        if !installed {
            return Ok(false);
        }
        sqlx::query_scalar(
            "select exists (select from bloom_guard.logged where rel = $1::regclass)",
        )
        .bind(&self.table)
        .fetch_one(pool)
        .await
    }

    /// Whether the table is watched with this key, every trigger in place
    /// and this version's functions: then [`install`](Self::install) has
    /// nothing to do, and takes no lock and needs no right beyond the
    /// runtime role's ([`grant_runtime`](crate::postgres::grant_runtime)). One
    /// statement; `false` on any error (the feed not installed, or of an
    /// earlier version), and `watch` runs.
    async fn is_current(&self, pool: &sqlx::PgPool) -> bool {
        sqlx::query_scalar(
            "select exists (select from bloom_guard.watched w
                             where w.guard = $3 and w.rel = $1::regclass and w.key_columns = $2)
                    and not exists (select from bloom_guard.gaps($3))
                    and bloom_guard.counts_rows($3)",
        )
        .bind(&self.table)
        .bind(&self.key_columns)
        .bind(self.feed_name())
        .fetch_one(pool)
        .await
        .unwrap_or(false)
    }

    /// One try of [`install`](Self::install): an error if a lock on the
    /// table is not granted within [`DDL_LOCK_TIMEOUT`] (a running
    /// follower's repair tries again at its next check).
    pub(crate) async fn watch_once(&self, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        let mut tx = pool.begin_with(QUIET).await?;
        sqlx::query("select bloom_guard.watch($1::regclass, $2, $3)")
            .bind(&self.table)
            .bind(&self.key_columns)
            .bind(self.feed_name())
            .execute(&mut *tx)
            .await?;
        tx.commit().await
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
    pub(crate) async fn uninstall_postgres(&self, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        retrying_locks("unwatch", || async {
            let mut tx = pool.begin_with(QUIET).await?;
            sqlx::query("select bloom_guard.unwatch($1::regclass, $2)")
                .bind(&self.table)
                .bind(self.feed_name())
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        })
        .await?;
        Ok(())
    }

    /// The query whose rows are every key of the table in canonical form,
    /// as the feed's triggers write them.
    pub(super) async fn key_query(
        &self,
        pool: &sqlx::PgPool,
        lowered: bool,
    ) -> Result<String, sqlx::Error> {
        let (table, key): (String, String) =
            sqlx::query_as("select $1::regclass::text, bloom_guard.key_expression($2, 't')")
                .bind(&self.table)
                .bind(&self.key_columns)
                .fetch_one(pool)
                .await?;
        if lowered {
            return Ok(format!(
                "select {} from (select {key} as k from {table} as t) as keys",
                super::feed::lowered("k")
            ));
        }
        Ok(format!("select {key} from {table} as t"))
    }
}

impl sealed::Sealed for sqlx::Postgres {}

impl TriggerFeed for sqlx::Postgres {
    async fn install(watch: &Watch, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        watch.install_postgres(pool).await
    }

    async fn uninstall(watch: &Watch, pool: &sqlx::PgPool) -> Result<(), FeedError> {
        watch.uninstall_postgres(pool).await
    }

    async fn key_type(
        watch: &Watch,
        pool: &sqlx::PgPool,
    ) -> Result<bloom_guard::KeyType, FeedError> {
        watch.key_type_postgres(pool).await
    }
}

#[cfg(feature = "log-feed")]
impl crate::watch::log_sealed::Sealed for sqlx::Postgres {}

#[cfg(feature = "log-feed")]
impl crate::watch::LogFeed for sqlx::Postgres {
    async fn install_log(
        watch: &Watch,
        pool: &sqlx::PgPool,
    ) -> Result<(), crate::error::FeedError> {
        watch.install_postgres_log(pool).await
    }

    async fn uninstall_log(
        watch: &Watch,
        pool: &sqlx::PgPool,
    ) -> Result<(), crate::error::FeedError> {
        watch.uninstall_postgres_log(pool).await
    }
}
