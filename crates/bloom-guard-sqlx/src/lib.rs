#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod abort;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod backoff;
mod batches;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod changes;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod column;
mod copy_text;
mod error;
#[cfg(feature = "postgres")]
mod fleet;
#[cfg(feature = "postgres")]
mod follower;
#[cfg(feature = "postgres")]
mod install;
#[cfg(feature = "postgres")]
mod pg_copy;
#[cfg(feature = "postgres")]
mod pg_feed;
#[cfg(feature = "postgres")]
mod pg_snapshot;
mod query;
#[cfg(feature = "sqlite")]
mod sqlite_feed;
#[cfg(feature = "sqlite")]
mod sqlite_snapshot;
mod watch;

pub use copy_text::{CopyTextDecoder, CopyTextError};
pub use error::{FeedError, SourceError};
#[cfg(feature = "postgres")]
pub use fleet::FleetRebuild;
#[cfg(feature = "postgres")]
pub use follower::{PgFollower, LISTENER_APPLICATION_NAME};
#[cfg(feature = "postgres")]
pub use install::{install, POSTGRES_SQL, SCHEMA_VERSION};
#[cfg(feature = "postgres")]
pub use pg_copy::PgCopySource;
pub use query::QuerySource;
#[cfg(feature = "sqlite")]
pub use sqlite_feed::SqliteFollower;
pub use watch::Watch;
