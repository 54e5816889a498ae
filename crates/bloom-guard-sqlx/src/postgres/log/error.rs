//! Why the log stream, or its producer, stopped.

use super::pgoutput;
use super::rows::RelationError;

/// Why the stream stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    #[error("the replication connection failed")]
    Replication(#[source] pgwire_replication::PgWireError),
    #[error("the replication stream ended")]
    Ended,
    #[error(transparent)]
    Decode(#[from] pgoutput::DecodeError),
    #[error("a change of relation {0} came before its description")]
    UnknownRelation(u32),
    /// The publication has a table the stream was not told of: one put on
    /// the log feed since it started. Start again with the tables now.
    #[error("{0}.{1} is published but not among the stream's tables")]
    Unwatched(String, String),
    #[error("the log cannot follow a watched table: {0}")]
    Relation(#[from] RelationError),
    #[error("the database URL cannot open a replication connection: {0}")]
    Url(String),
    #[error("the replication URL reaches {url}, the pool {pool}: give both the same database")]
    OtherDatabase { url: String, pool: String },
    #[error("the server's answer to {0} is not as documented")]
    Answer(&'static str),
}

/// Why the log feed's slot could not be made (again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SlotError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// The slot in the way could not be dropped: a reader still streams
    /// it after it was asked to stop.
    #[error("the log feed's slot {0} stays in use; it cannot be made again")]
    InUse(String),
}

/// Why a producer's stream stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProducerError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The slot was made again (its epoch changed) after this stream
    /// began: what it decoded belongs to the slot before.
    #[error("the log feed's slot was made again since this stream began; streaming it anew")]
    SlotRemade,
    /// A transaction decoded from the log did not turn visible in time.
    #[error("transaction {0}, decoded from the log, is not visible")]
    NotVisible(u64),
}
