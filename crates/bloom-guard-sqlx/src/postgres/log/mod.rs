//! The change feed from Postgres's write-ahead log, with no trigger on the
//! watched tables: the [`Follower`] of a table on it
//! ([`Watch::install_log`](crate::watch::Watch::install_log)), and
//! [`check_replication`] for the URL its replication connections use.
//!
//! Inside: the change feed from Postgres's write-ahead log (`wal_level=logical`):
//! a logical replication slot streamed with `pgoutput`, each committed
//! transaction's key changes in commit order, once, as the feed's triggers
//! record them. The parts so far: the messages' decoding (`pgoutput`),
//! a change's feed rows (`rows`), the slot's stream (`stream`) and why it stops (`error`), a table
//! put on the log feed (`install`), the producer that writes the stream
//! to the feed (`producer`), a scan's exact place in the log
//! (`stream::ScanPoint`), and reads with the barrier by log position
//! (`feed`), the slot, made again when it is missing or lost
//! (`slot`), and the election of the instance that streams it (`lease`).

mod backend;
mod check;
mod error;
mod feed;
mod follower;
mod install;
mod lease;
mod pgoutput;
mod position;
mod producer;
mod publication;
mod rows;
pub(super) mod slot;
pub(super) mod stream;
pub(super) mod url;
mod write;

pub(crate) use backend::PgLogBackend;
pub use follower::Follower;
pub use url::check_replication;

#[cfg(test)]
mod tests;
