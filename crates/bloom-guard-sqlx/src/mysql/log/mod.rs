//! The change feed from the binary log of MySQL or MariaDB, with no
//! trigger on the watched tables (feature `binlog-feed`): the [`Follower`]
//! of a table on it ([`Watch::install_log`](crate::Watch::install_log) on
//! a MySQL pool).
//!
//! Inside: one reader per server, elected among the followers' processes
//! (`producer`), streams the log over the replication protocol (`stream`)
//! for every database whose feed someone follows (`reader`), turns each
//! committed transaction's row images into feed rows (`rows`), and writes
//! them with the transaction's end point and each feed's progress, in
//! commit order (`write`); followers read the rows after their point, and a read for
//! waiting refusals first waits until the producer has written what the
//! log held when it began (`feed`); a would-be refusal itself waits for a
//! lookup of its key in the table instead (`lookup`). Scans take a snapshot's point in the
//! log (`scan`); a point of another server or a purged log starts the
//! feed over (`position`, `producer`). The stream's connection comes from
//! the URL (`url`); wake-ups from the producer's progress (`wake`); the
//! tables on the feed from its registry (`registry`).

mod backend;
mod error;
mod feed;
mod follower;
mod install;
mod lookup;
mod position;
mod producer;
mod reader;
pub(crate) mod registry;
mod rows;
mod scan;
mod stream;
mod url;
mod wake;
mod write;

pub(crate) use backend::MySqlLogBackend;
pub use follower::Follower;
