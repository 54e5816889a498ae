#![doc = include_str!("../README.md")]

mod batches;
mod copy_text;
mod error;
#[cfg(feature = "postgres")]
mod follower;
#[cfg(feature = "postgres")]
mod pg_copy;
mod query;

pub use copy_text::{CopyTextDecoder, CopyTextError};
pub use error::SourceError;
#[cfg(feature = "postgres")]
pub use follower::{PgFollower, LISTENER_APPLICATION_NAME};
#[cfg(feature = "postgres")]
pub use pg_copy::PgCopySource;
pub use query::QuerySource;

/// The repository README's library example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;
