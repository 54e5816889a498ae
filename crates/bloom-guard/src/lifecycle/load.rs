//! A scan's keys on their way into the new filter. A counting filter takes
//! them in shard order: a scan's hashes are gathered [`LOAD_HASHES`] at a
//! time and put in by shard on a blocking thread, while the scan goes on
//! reading the next ones; it waits only when a set is still going in
//! once the next one is gathered.
//!
//! A scan that fails or is dropped leaves the set going in to finish on its
//! own, into a filter nobody uses any more.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::error::BuildError;
use crate::filters::filter::Filter;
use crate::keys::batch::KeyBatch;

/// Hashes gathered before they go into a counting filter: 2 MiB, twice
/// (one set going in, one being gathered). At 50M keys a set still visits
/// each shard with about 300 hashes; twice as many cost 4 MiB more of a
/// start's peak memory, for no faster scan.
#[cfg(not(test))]
pub(crate) const LOAD_HASHES: usize = 1 << 18;
/// Small in tests, so that a scan of a few thousand keys hands sets over.
#[cfg(test)]
pub(crate) const LOAD_HASHES: usize = 1 << 12;

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
        if self.filter.counting().is_none() {
            self.filter.insert_batch(batch, &mut self.pending);
            return Ok(());
        }
        // A set never outgrows its buffer: the batch goes into the next.
        if !self.pending.is_empty() && self.pending.len() + batch.len() > LOAD_HASHES {
            // The set before must be in: at most two sets are held.
            let spare = match self.wait().await? {
                Some(spare) => spare,
                None => Vec::with_capacity(LOAD_HASHES),
            };
            let full = std::mem::replace(&mut self.pending, spare);
            self.going_in = Some(self.put_in(full));
        }
        // It grows by doubling to at most LOAD_HASHES, a power of two.
        if let Some(counting) = self.filter.counting() {
            counting.hash_batch(batch, &mut self.pending);
        }
        Ok(())
    }

    /// Every key loaded is in the filter once this returns.
    pub(crate) async fn finish(mut self) -> Result<(), BuildError> {
        self.wait().await?;
        if !self.pending.is_empty() {
            let last = std::mem::take(&mut self.pending);
            self.going_in = Some(self.put_in(last));
            self.wait().await?;
        }
        Ok(())
    }

    /// Puts `hashes` into the counting filter on a blocking thread; hands
    /// the buffer back empty.
    fn put_in(&self, mut hashes: Vec<u64>) -> JoinHandle<Vec<u64>> {
        let filter = Arc::clone(&self.filter);
        tokio::task::spawn_blocking(move || {
            if let Some(counting) = filter.counting() {
                counting.insert_hashes(&mut hashes);
            }
            hashes.clear();
            hashes
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key::Key;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scan_that_hands_over_many_sets_holds_every_row_once() {
        let filter = Arc::new(Filter::new(30_000, 0.001, true));
        let mut loader = Loader::new(Arc::clone(&filter));
        let keys: Vec<String> = (0..40_000).map(|i| format!("k{i}")).collect();
        // Batches of uneven sizes, none a divisor of the set's.
        for chunk in keys.chunks(1_000).flat_map(|chunk| chunk.chunks(333)) {
            let batch: KeyBatch = chunk.iter().map(String::as_str).collect();
            loader.load(&batch).await.expect("loads");
            assert!(loader.pending.len() <= LOAD_HASHES);
        }
        loader.finish().await.expect("finishes");
        let counting = filter.counting().expect("a counting filter");
        assert_eq!(counting.keys(), 40_000);
        assert!(keys
            .iter()
            .all(|k| filter.contains(&Key::from(k.as_bytes()))));
        counting.set_exact(true);
        for k in &keys {
            counting.remove(&Key::from(k.as_bytes()));
        }
        assert_eq!((counting.missed(), counting.keys()), (0, 0));
    }
}
