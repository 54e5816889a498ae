//! The errors of the sqlx key sources and change feeds.

/// Why `COPY` output could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CopyTextError {
    /// A row held more than one column. The key query must select exactly
    /// one column: `SELECT key FROM items`.
    #[error("a COPY row has more than one column; select only the key column")]
    SeveralColumns,
    /// A row ended inside an escape sequence, or the data ended inside a
    /// row: the output was cut short.
    #[error("COPY output ended in the middle of a row")]
    Truncated,
}

/// Why a sqlx key source failed to count or to scan.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The database refused or failed the query: check the connection and
    /// that the key query is valid and selects one text column.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The `COPY` output could not be decoded.
    #[error("malformed COPY output")]
    CopyText(#[from] CopyTextError),
    /// The scan task stopped without finishing (the runtime is shutting down).
    #[error("the scan task stopped before the end of the keys")]
    Interrupted,
    /// The change feed was pruned past the scan's snapshot before it could
    /// be replayed: the scan took longer than the feed's retention. Raise
    /// the retention (see `postgres::Follower::retention`).
    #[error("the change feed was pruned past the scan's snapshot; raise the retention")]
    FeedPruned,
    /// A scan of a table on the log feed could not take its place in the
    /// write-ahead log (a replication connection that failed or was
    /// refused): no filter is built from it. The message says why; check
    /// the replication URL and the role's `REPLICATION` right.
    #[error("the scan could not take its place in the write-ahead log: {0}")]
    LogPoint(String),
}

/// Why installing, watching or reading a change feed failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FeedError {
    /// The database refused or failed a statement: check the connection,
    /// that [`install`](crate::postgres::install) ran, and the role's rights (watching
    /// a table needs its ownership).
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The connections go through a pooler that breaks the follower's
    /// sessions: one in transaction mode (PgBouncer's `pool_mode =
    /// transaction`), where `LISTEN` and session advisory locks do not
    /// survive, or one that refuses the startup parameters of the
    /// follower's own connections. Give the follower a pool with a direct
    /// URL, or a pooler database in session mode that lets the parameter
    /// `options` through (the feed's page, "Connections and poolers"). Not
    /// retried: a setting must change.
    #[error("the database connection goes through a pooler that breaks sessions ({0}): LISTEN and session advisory locks need a session of their own; give the follower a pool with a direct URL, or a pooler database in session mode that passes the startup parameter `options`")]
    Pooler(String),
    /// No key type compares a watched key column as the database does (a
    /// case- and accent-insensitive collation, a type parsed rather than
    /// compared): the guard could never refuse a key of it. Each column is
    /// named with its type or collation and what to change. Not retried: a
    /// column or a setting must change.
    #[error("no key type compares the key as the database does, so the guard could never refuse one: {0}")]
    Uncomparable(String),
    /// The table is fed by its database's log (Postgres's write-ahead log,
    /// the binary log of MySQL or MariaDB): the feed's triggers on it would
    /// write every change a second time, and a delete applied twice can
    /// remove another key. Take it off the log feed first
    /// (`Watch::uninstall_log`); switching feeds is a rebuild. Not retried.
    #[error(
        "{0} is fed by the database's log; a table has one feed: take it off the log feed first"
    )]
    LogFed(String),
    /// The table cannot be put on the log feed: on Postgres, the server's
    /// `wal_level` is not `logical` or a key column is not in the table's
    /// replica identity (a delete would reach the log without its key); on
    /// MySQL or MariaDB, the binary log is off or not in `ROW` format, its
    /// row image leaves the key out, or a key column's type is not one the
    /// binary log feed reads; or the feed's triggers feed it. The message
    /// says what to change. Not retried.
    #[error("cannot put the table on the log feed: {0}")]
    LogFeed(String),
    /// The log feed's replication connections cannot work with the URL
    /// given: it is not one the log feed reads (its TLS settings among
    /// them), the server refuses the connection (TLS, the password, a role
    /// without REPLICATION), or it reaches another database than the pool.
    /// The message says which. Not retried.
    #[error("the log feed's replication URL cannot be used: {0}")]
    ReplicationUrl(String),
    /// The database is a standby (in recovery): it cannot take the feed's
    /// wake-ups, heartbeats or snapshots, and its transaction ids are the
    /// primary's. Give the follower a pool on the primary's URL (a
    /// multi-host URL lists every server and lets the client find it). Not
    /// retried.
    #[error("the database is a standby (in recovery), which cannot run a follower: give the primary's URL")]
    Standby,
}

/// `error: cause: cause`, for a log line.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
