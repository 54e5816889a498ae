#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The key sources (any sqlx query, Postgres COPY), the SQL tables every
// backend shares (snapshots, fleet), the follower engine, and its backends.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod ddl;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod digest;
mod error;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod fleet_rebuild;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod follow;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod kept;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod lock;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod per_database;
#[cfg(feature = "postgres")]
mod postgres;
mod source;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod store;
mod watch;

pub use error::{FeedError, SourceError};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use fleet_rebuild::FleetRebuild;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use follow::Follow;
#[cfg(feature = "mysql")]
pub use mysql::{uninstall_mysql, MySqlFollower};
#[cfg(feature = "postgres")]
pub use postgres::warm_pool;
#[cfg(feature = "log-feed")]
pub use postgres::{check_replication, PgLogFollower};
#[cfg(feature = "postgres")]
pub use postgres::{
    check_session, grant_runtime, install, uninstall, PgCopySource, PgFollower, PgServers,
    ServersError, TargetSession, FEED_APPLICATION_NAME, LISTENER_APPLICATION_NAME,
    NOTIFIER_APPLICATION_NAME, POSTGRES_SQL, SCHEMA_VERSION,
};
pub use source::copy_text::{CopyTextDecoder, CopyTextError};
pub use source::query::QuerySource;
#[cfg(feature = "sqlite")]
pub use sqlite::{uninstall_sqlite, SqliteFollower};
pub use watch::Watch;
