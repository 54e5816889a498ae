//! Which table and key columns a change feed watches, and putting them on
//! the trigger feed of any of the three databases ([`TriggerFeed`]).

use std::future::Future;

use bloom_guard::KeyType;
use sqlx::Pool;

use crate::error::FeedError;

/// A table whose keys a guard holds, and the column(s) that make the key.
///
/// The same value installs the feed's triggers ([`install`](Self::install),
/// once, at migration time, on Postgres, MySQL/MariaDB or SQLite alike),
/// gives the warm-up scan its key query, and names
/// the feed that a follower reads. A table with children or partitions is
/// watched whole.
///
/// # Keys
///
/// One column: its Postgres text form (`key::text`: an integer in decimal,
/// a UUID in lower case with hyphens). Several columns: each part's text
/// prefixed by its length in bytes and a colon, `2:423:abc` for `(42,
/// 'abc')`, which no other key shares. Rows with a NULL key part are left
/// out: no request can name them.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::Watch;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let users = Watch::table("users").key("id");
/// let orders = Watch::table("shop.orders").key("tenant").key("number").name("orders");
/// users.install(&pool).await?;
/// orders.install(&pool).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub(crate) table: String,
    pub(crate) key_columns: Vec<String>,
    name: Option<String>,
}

impl Watch {
    /// Watches `table` (as SQL names it: `items`, `shop.orders`,
    /// `"Mixed Case"`). Add its key column(s) with [`key`](Self::key): a
    /// watch without one is refused by the database.
    pub fn table(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_columns: Vec::new(),
            name: None,
        }
    }

    /// Adds a key column; call once per column of a composite key, in the
    /// order the request path names them.
    #[must_use]
    pub fn key(mut self, column: impl Into<String>) -> Self {
        self.key_columns.push(column.into());
        self
    }

    /// The feed's name (default: the table's name as given): the `guard`
    /// column of `bloom_guard.changes` and the payload of its wake-ups.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The feed's name.
    pub fn feed_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.table)
    }

    /// Installs the feed's triggers on the table (and, on Postgres, every
    /// child and partition it has): from then on every key written by any
    /// SQL client reaches the feed. Idempotent, and one read when the
    /// triggers are current, so every instance may call it at start.
    ///
    /// - **Postgres**: needs the schema first
    ///   ([`postgres::install`](crate::postgres::install)) and ownership of
    ///   the table; run it again after adding a partition or a child.
    ///   Refused for a table on the log feed ([`FeedError::LogFed`]).
    /// - **MySQL/MariaDB**: installs the feed's tables too; each try of the
    ///   triggers' DDL waits at most a second for the table's metadata
    ///   lock, so writers never queue behind it longer.
    /// - **SQLite**: installs the feed's table too.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table or a column does not exist, or
    /// a right is missing; [`FeedError::Uncomparable`] for a key column no
    /// key type compares as the database does, with nothing installed.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn run(pg: sqlx::PgPool, my: sqlx::MySqlPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// use bloom_guard_sqlx::Watch;
    ///
    /// let items = Watch::table("items").key("sku");
    /// items.install(&pg).await?;
    /// items.install(&my).await?;
    /// # Ok(()) }
    /// ```
    pub async fn install<D: TriggerFeed>(&self, pool: &Pool<D>) -> Result<(), FeedError> {
        D::install(self, pool).await
    }

    /// Drops the feed's triggers from the table (on Postgres, from its
    /// children and partitions too); the feed's own tables stay. A
    /// follower of the guard that still runs reports a gap and lets every
    /// request through.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if the table does not exist, the feed is not
    /// installed, or a right is missing.
    pub async fn uninstall<D: TriggerFeed>(&self, pool: &Pool<D>) -> Result<(), FeedError> {
        D::uninstall(self, pool).await
    }

    /// The [`KeyType`] that compares the key column(s) as the database
    /// does (their type and collation), for
    /// [`Builder::key_type`](bloom_guard::Builder::key_type).
    ///
    /// # Errors
    ///
    /// [`FeedError::Uncomparable`] for a column no key type compares as the
    /// database does (a case- and accent-insensitive collation, a type
    /// parsed rather than compared, numeric affinity on SQLite);
    /// [`FeedError::Database`] if the table cannot be read or lacks a key
    /// column.
    pub async fn key_type<D: TriggerFeed>(&self, pool: &Pool<D>) -> Result<KeyType, FeedError> {
        D::key_type(self, pool).await
    }

    /// Puts the table on its database's log feed: from then on every
    /// committed change of its key reaches the feed from the database's
    /// own log, with no trigger on the table. Idempotent.
    ///
    /// - **Postgres** (feature `log-feed`): the write-ahead log, through
    ///   the database's logical replication slot; follow it with
    ///   [`postgres::log::Follower`](crate::postgres::log::Follower). Needs
    ///   `wal_level=logical`, [`install`](crate::postgres::install) first, a
    ///   role that may create the publication `bloom_guard` and the slot
    ///   (ownership of the table, the REPLICATION attribute), and a replica
    ///   identity that holds the key: the primary key, `REPLICA IDENTITY
    ///   USING INDEX` a unique index on it, or `FULL`.
    /// - **MySQL and MariaDB** (feature `binlog-feed`): the binary log, read
    ///   over the replication protocol; follow it with
    ///   `mysql::log::Follower`. Needs `log_bin` on,
    ///   `binlog_format=ROW`, and `binlog_row_image=FULL` unless the key is
    ///   the primary key; key columns that are integers, binary strings, or
    ///   strings in `utf8mb4`, `utf8mb3` or `ascii`; a role with
    ///   `REPLICATION SLAVE` and `REPLICATION CLIENT`. Scans take a
    ///   snapshot's place in the log, which MariaDB gives; MySQL has no such
    ///   status, and its followers report a scan error.
    ///
    /// A table has one feed: one the feed's triggers feed is refused.
    ///
    /// # Errors
    ///
    /// [`FeedError::LogFeed`] for a server whose log cannot feed the table
    /// (the reason says what to change), a key outside what the log
    /// carries, or a table the feed's triggers feed;
    /// [`FeedError::Database`] if a statement fails.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # #[cfg(feature = "log-feed")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// bloom_guard_sqlx::postgres::install(&pool).await?;
    /// bloom_guard_sqlx::Watch::table("items").key("key").install_log(&pool).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
    pub async fn install_log<D: LogFeed>(&self, pool: &Pool<D>) -> Result<(), FeedError> {
        D::install_log(self, pool).await
    }

    /// Takes the table off its database's log feed. Followers of the guard
    /// on the log feed report a gap and let every request through. To
    /// switch the table to the feed's triggers, stop the log feed's
    /// followers of it, take it off, then [`install`](Watch::install) it:
    /// its followers rebuild from a scan. Idempotent.
    ///
    /// # Errors
    ///
    /// [`FeedError::Database`] if a statement fails (on Postgres: the table
    /// does not exist, the feed is not installed, or the role does not own
    /// the table).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # #[cfg(feature = "log-feed")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
    /// let items = bloom_guard_sqlx::Watch::table("items").key("key");
    /// items.uninstall_log(&pool).await?;
    /// items.install(&pool).await?; // on the triggers from here on
    /// # Ok(()) }
    /// ```
    #[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
    pub async fn uninstall_log<D: LogFeed>(&self, pool: &Pool<D>) -> Result<(), FeedError> {
        D::uninstall_log(self, pool).await
    }
}

/// The databases whose own log can feed a table ([`Watch::install_log`]):
/// Postgres's write-ahead log (feature `log-feed`) and the binary log of
/// MySQL and MariaDB (feature `binlog-feed`). Sealed.
#[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
pub trait LogFeed: sqlx::Database + log_sealed::Sealed {
    #[doc(hidden)]
    fn install_log(
        watch: &Watch,
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), FeedError>> + Send;
    #[doc(hidden)]
    fn uninstall_log(
        watch: &Watch,
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), FeedError>> + Send;
}

#[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
pub(crate) mod log_sealed {
    pub trait Sealed {}
}

/// A database whose tables a [`Watch`] puts on the trigger feed:
/// [`Postgres`](sqlx::Postgres), [`MySql`](sqlx::MySql) (MySQL 8 and
/// MariaDB 10.6 or later) and [`Sqlite`](sqlx::Sqlite), each with its
/// feature. Sealed: the feeds are this crate's.
pub trait TriggerFeed: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    fn install(
        watch: &Watch,
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), FeedError>> + Send;
    #[doc(hidden)]
    fn uninstall(
        watch: &Watch,
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<(), FeedError>> + Send;
    #[doc(hidden)]
    fn key_type(
        watch: &Watch,
        pool: &Pool<Self>,
    ) -> impl Future<Output = Result<KeyType, FeedError>> + Send;
}

pub(crate) mod sealed {
    /// Keeps [`TriggerFeed`](super::TriggerFeed) to this crate's feeds.
    pub trait Sealed {}
}
