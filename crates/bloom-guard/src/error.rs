//! Why a filter build failed.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;

/// Why a filter build failed. The guard keeps the filter it had.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The key source failed to count or to scan; check that the database
    /// is reachable and the key query is valid.
    #[error("the key source failed")]
    Source(#[source] Arc<dyn StdError + Send + Sync>),
    /// Keys read by the scan were not found in the new filter: a defect,
    /// never expected. The filter was not put in use.
    #[error("{missing} of {checked} sampled keys are missing from the new filter")]
    Verification {
        /// Sampled keys the new filter does not hold.
        missing: usize,
        /// Keys sampled.
        checked: usize,
    },
    /// The rebuild this call joined was cancelled before it finished;
    /// call again.
    #[error("the rebuild in flight was cancelled")]
    Cancelled,
    /// The new filter's estimated false-positive rate is above its bound
    /// ([`Builder::rebuild_above`](crate::Builder::rebuild_above) × the
    /// target), so it was not put in use.
    #[error(
        "the new filter's estimated false-positive rate {estimated_fpp} is above its bound {bound}"
    )]
    Overfull {
        /// The new filter's estimated rate.
        estimated_fpp: f64,
        /// The highest rate a filter in use may have.
        bound: f64,
    },
}

/// Why a snapshot was not adopted. The guard keeps the filter it had.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AdoptError {
    /// The snapshot is another guard's, of another key type, or of another
    /// key query.
    #[error("the snapshot's {what} is {found:?}, not {expected:?}")]
    Mismatch {
        /// `guard`, `key type` or `key query`.
        what: &'static str,
        /// This guard's.
        expected: String,
        /// The snapshot's.
        found: String,
    },
    /// Replaying the changes since the snapshot failed.
    #[error("catching up from the snapshot's position failed")]
    CatchUp(#[source] Arc<dyn StdError + Send + Sync>),
    /// The snapshot's filter, with the changes replayed into it, has an
    /// estimated false-positive rate above its bound: it was not put in
    /// use. Scan instead.
    #[error("the adopted filter's estimated false-positive rate {estimated_fpp} is above its bound {bound}")]
    Overfull {
        /// The filter's estimated rate.
        estimated_fpp: f64,
        /// The highest rate a filter in use may have.
        bound: f64,
    },
}

impl BuildError {
    pub(crate) fn source(error: impl StdError + Send + Sync + 'static) -> Self {
        BuildError::Source(Arc::new(error))
    }
}

/// `error: cause: cause`, for a log line or the stats.
pub(crate) fn error_chain(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    message
}
