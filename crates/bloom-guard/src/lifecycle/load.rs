//! A scan's keys on their way into the new filter. A counting filter takes
//! them in shard order: a scan's hashes are gathered [`LOAD_HASHES`] at a
//! time and put in by shard on a blocking thread, while the scan goes on
//! reading the next ones, so the database never waits for the filter.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::error::BuildError;
use crate::filters::filter::Filter;
use crate::keys::batch::KeyBatch;

/// Hashes gathered before they go into a counting filter: 4 MiB, twice
/// (one set going in, one being gathered).
pub(crate) const LOAD_HASHES: usize = 1 << 19;

/// Puts a scan's batches into its filter.
pub(crate) struct Loader {
    filter: Arc<Filter>,
    /// A counting filter's hashes gathered; a Bloom filter's batch.
    pending: Vec<u64>,
    /// The hashes going in, handed back empty once they are in.
    going_in: Option<JoinHandle<Vec<u64>>>,
}

impl Loader {
    pub(crate) fn new(filter: Arc<Filter>) -> Self {
        Self {
            filter,
            pending: Vec::new(),
            going_in: None,
        }
    }

    /// A batch of the scan: into a Bloom filter now; a counting filter's
    /// hashes are gathered and go in [`LOAD_HASHES`] at a time.
    pub(crate) async fn load(&mut self, batch: &KeyBatch) -> Result<(), BuildError> {
        let Some(counting) = self.filter.counting() else {
            self.filter.insert_batch(batch, &mut self.pending);
            return Ok(());
        };
        counting.hash_batch(batch, &mut self.pending);
        if self.pending.len() < LOAD_HASHES {
            return Ok(());
        }
        // The set before must be in: at most two sets are held.
        let spare = self.wait().await?.unwrap_or_default();
        let full = std::mem::replace(&mut self.pending, spare);
        let filter = Arc::clone(&self.filter);
        self.going_in = Some(tokio::task::spawn_blocking(move || {
            let mut hashes = full;
            if let Some(counting) = filter.counting() {
                counting.insert_hashes(&mut hashes);
            }
            hashes.clear();
            hashes
        }));
        Ok(())
    }

    /// Every key loaded is in the filter once this returns.
    pub(crate) async fn finish(mut self) -> Result<(), BuildError> {
        self.wait().await?;
        if let Some(counting) = self.filter.counting() {
            counting.insert_hashes(&mut self.pending);
        }
        Ok(())
    }

    /// Waits for the set going in; its buffer, empty, to reuse.
    async fn wait(&mut self) -> Result<Option<Vec<u64>>, BuildError> {
        let Some(going_in) = self.going_in.take() else {
            return Ok(None);
        };
        match going_in.await {
            Ok(spare) => Ok(Some(spare)),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(BuildError::Cancelled),
        }
    }
}
