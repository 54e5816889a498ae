//! Building a filter from a `KeySource`: warm-up at start and rebuilds.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::filter::Filter;
use crate::guard::{BloomGuard, Shared};
use crate::source::KeySource;
use crate::stats::Stats;

/// Why a filter build failed. The guard keeps the filter it had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The key source failed to count or to scan; check that the database
    /// is reachable and the key query is valid.
    #[error("the key source failed")]
    Source(#[source] Box<dyn StdError + Send + Sync>),
}

impl<K> BloomGuard<K> {
    /// Loads every key of `source` into a first filter, retrying until it
    /// succeeds, and returns once the guard is ready.
    ///
    /// The guard fails open meanwhile. A failing source is retried with
    /// jittered exponential backoff from 100 ms up to
    /// [`Builder::max_retry_delay`](crate::Builder::max_retry_delay), each
    /// failure logged once and shown in [`Stats::last_error`]; the state is
    /// `degraded` until an attempt succeeds. Progress (keys, keys/s) is
    /// logged every few seconds. If the source held far more keys than its
    /// count hint said, the filter is built once more at the right size.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder().build();
    /// tokio::spawn(guard.clone().warm(KeyList::new(["a", "b"])));
    /// # while !guard.is_ready() { tokio::task::yield_now().await; }
    /// # assert!(!guard.may_contain("c"));
    /// # }
    /// ```
    pub async fn warm<S: KeySource>(self, source: S) {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.build(&source, 0).await {
                Ok(filter) => {
                    if filter.keys() > filter.capacity() {
                        tracing::info!(
                            keys = filter.keys(),
                            capacity = filter.capacity(),
                            "the source held more keys than its count hint; resizing"
                        );
                        let _ = self.build(&source, filter.keys()).await;
                    }
                    return;
                }
                Err(_) => {
                    let pause = delay.mul_f64(0.5 + fastrand::f64());
                    tracing::info!(retry_in = ?pause, "bloom filter warm-up will retry");
                    tokio::time::sleep(pause).await;
                    delay = (delay * 2).min(self.shared.config.max_retry_delay);
                }
            }
        }
    }

    /// Builds a new filter from `source` and swaps it in, once.
    ///
    /// The new filter is sized from the source's count hint with headroom and
    /// gets a fresh random hasher key. It receives every
    /// [`insert`](Self::insert) from before its scan starts until it is in
    /// use, so writes during the scan are kept. If anything fails, the filter
    /// in use stays. Builds run one at a time.
    ///
    /// # Errors
    ///
    /// [`BuildError::Source`] if the source fails; it is also logged and
    /// shown in [`Stats::last_error`].
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), bloom_guard::BuildError> {
    /// let guard = BloomGuard::builder().build();
    /// let stats = guard.rebuild(&KeyList::new(["a", "b"])).await?;
    /// assert_eq!((stats.generation, stats.keys), (1, 2));
    /// # Ok(()) }
    /// ```
    pub async fn rebuild<S: KeySource>(&self, source: &S) -> Result<Stats, BuildError> {
        self.build(source, 0).await?;
        Ok(self.stats())
    }

    async fn build<S: KeySource>(&self, source: &S, floor: u64) -> Result<Arc<Filter>, BuildError> {
        let shared = &*self.shared;
        let _one_at_a_time = shared.build_lock.lock().await;
        let result = scan(shared, source, floor).await;
        match &result {
            Ok(_) => {}
            Err(error) => {
                let message = error_chain(error);
                tracing::warn!(error = %message, "bloom filter build failed; the filter in use stays");
                shared.record_failure(message);
            }
        }
        result
    }
}

async fn scan<S: KeySource>(
    shared: &Shared,
    source: &S,
    floor: u64,
) -> Result<Arc<Filter>, BuildError> {
    let started = Instant::now();
    let hint = source
        .count_hint()
        .await
        .map_err(|e| BuildError::Source(Box::new(e)))?;
    let config = &shared.config;
    let wanted = hint.unwrap_or(0).max(config.expected_items).max(floor);
    let capacity = (wanted as f64 * (1.0 + config.headroom)).ceil() as u64;
    let filter = Arc::new(Filter::new(capacity, config.target_fpp));
    tracing::info!(count_hint = ?hint, capacity, bits = filter.bits(), "bloom filter build started");

    let registration = Registration::new(shared, Arc::clone(&filter));
    let mut keys = source.keys();
    let mut scanned: u64 = 0;
    let mut last_report = (Instant::now(), 0_u64);
    while let Some(batch) = keys.next().await {
        let batch = batch.map_err(|e| BuildError::Source(Box::new(e)))?;
        for key in batch.iter() {
            filter.insert(&key);
        }
        scanned += batch.len() as u64;
        let since = last_report.0.elapsed();
        if since >= config.progress_interval {
            let rate = (scanned - last_report.1) as f64 / since.as_secs_f64();
            tracing::info!(
                keys = scanned,
                keys_per_sec = rate as u64,
                "bloom filter build in progress"
            );
            last_report = (Instant::now(), scanned);
        }
    }
    drop(keys);
    let generation = registration.promote();
    let elapsed = started.elapsed();
    tracing::info!(
        generation,
        keys = scanned,
        elapsed_ms = elapsed.as_millis() as u64,
        keys_per_sec = (scanned as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
        estimated_fpp = filter.estimated_fpp(),
        "bloom filter ready"
    );
    Ok(filter)
}

/// A filter registered for write-through inserts; unregistered on drop
/// unless promoted, so a failed or cancelled build leaves nothing behind.
struct Registration<'a> {
    shared: &'a Shared,
    filter: Option<Arc<Filter>>,
}

impl<'a> Registration<'a> {
    fn new(shared: &'a Shared, filter: Arc<Filter>) -> Self {
        shared.register(&filter);
        Self {
            shared,
            filter: Some(filter),
        }
    }

    fn promote(mut self) -> u64 {
        let filter = self.filter.take().expect("a registration is promoted once");
        self.shared.promote(&filter)
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(filter) = self.filter.take() {
            self.shared.unregister(&filter);
        }
    }
}

/// `error: cause: cause`, for a log line or the stats.
fn error_chain(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(message, ": {cause}");
        source = cause.source();
    }
    message
}
