#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batches;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod changes;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod column;
mod copy_text;
mod error;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod fleet_rebuild;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod fleet_store;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod follow;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod lock;
#[cfg(feature = "postgres")]
mod postgres;
mod query;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod snapshot_store;
#[cfg(feature = "sqlite")]
mod sqlite;
mod watch;

pub use copy_text::{CopyTextDecoder, CopyTextError};
pub use error::{FeedError, SourceError};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use fleet_rebuild::FleetRebuild;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use follow::Follow;
#[cfg(feature = "postgres")]
pub use postgres::{
    install, uninstall, PgCopySource, PgFollower, LISTENER_APPLICATION_NAME,
    NOTIFIER_APPLICATION_NAME, POSTGRES_SQL, SCHEMA_VERSION,
};
pub use query::QuerySource;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteFollower;
pub use watch::Watch;
