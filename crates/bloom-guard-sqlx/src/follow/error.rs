//! Why a backend could not do what the engine asked.

/// Why a backend could not do what the engine asked: a database error, or
/// one the backend names. The engine logs it, fails open where a read or a
/// check failed, and tries again; no variant is retried differently.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BackendError {
    /// The database refused or failed a statement.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The table is on the other feed of its database: Postgres's
    /// write-ahead log, not the triggers.
    #[cfg(feature = "postgres")]
    #[error("{0} is on the log feed: follow it with postgres::log::Follower, rebuild it with FleetRebuild::log")]
    OnTheLogFeed(String),
    /// A feed that could not be read for a reason of its own (the log
    /// feed's producer behind the barrier's bound, its slot missing, a
    /// member of the table's family the log never carries).
    #[cfg(any(feature = "log-feed", feature = "binlog-feed"))]
    #[error(transparent)]
    Feed(Box<dyn std::error::Error + Send + Sync>),
}
