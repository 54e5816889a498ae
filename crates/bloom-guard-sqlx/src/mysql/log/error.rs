//! Why the binary log's producer, or a read's wait for it, stopped.

/// Why the binary log feed's producer stopped, or a read could not wait
/// for it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BinlogError {
    /// A statement on the feed's tables or the server's status failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The binary log's stream failed: the connection, the server's
    /// refusal (a purged file, a missing `REPLICATION SLAVE` right), or an
    /// event that could not be decoded.
    #[error("the binary log's stream failed")]
    Stream(#[from] mysql_async::Error),
    /// The server writes no binary log (`log_bin` is off).
    #[error("the server writes no binary log: log_bin is off")]
    NoBinlog,
    /// The producer had not written what the log held when the read began,
    /// within the read's bound.
    #[error("the binary log feed's producer did not reach the log's position {0} in time")]
    Behind(String),
    /// The stream ended, or another producer wrote a feed's progress: the
    /// producer starts again from the progress.
    #[error("the binary log feed's producer lost its place: {0}")]
    Lost(String),
    /// Another session holds a database's feed tables locked (a dump
    /// with `LOCK TABLES`, DDL) past the producer's lock wait.
    #[error("the feed tables of database {0} are locked by another session")]
    Blocked(String),
    /// The URL the producer streams the log with cannot be used.
    #[error("the binary log feed's URL cannot be used: {0}")]
    Url(String),
}

/// The server's error number of `error`, where the server refused a
/// statement (`ER_LOCK_WAIT_TIMEOUT` is 1205).
pub(super) fn server_error(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(sqlx::mysql::MySqlDatabaseError::number)
}
