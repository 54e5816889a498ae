//! The error of the sqlx key sources.

use crate::copy_text::CopyTextError;

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
}
