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
                Ok(built) => {
                    if built.scanned > built.filter.capacity() {
                        tracing::info!(
                            keys = built.scanned,
                            capacity = built.filter.capacity(),
                            "the source held more keys than its count hint; resizing"
                        );
                        let _ = self.build(&source, built.scanned).await;
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

    async fn build<S: KeySource>(&self, source: &S, floor: u64) -> Result<Built, BuildError> {
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

/// A filter put in use, and how many keys its scan read.
struct Built {
    filter: Arc<Filter>,
    scanned: u64,
}

async fn scan<S: KeySource>(shared: &Shared, source: &S, floor: u64) -> Result<Built, BuildError> {
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
    Ok(Built { filter, scanned })
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::stream::{self, BoxStream, StreamExt};
    use tokio::sync::oneshot;

    use crate::{BloomGuard, KeyBatch, KeyList, KeySource, State};

    #[derive(Debug, thiserror::Error)]
    #[error("database unreachable")]
    struct Unreachable;

    /// Fails its first `failures` scans, then yields `keys`.
    struct Flaky {
        failures: usize,
        attempts: AtomicUsize,
        keys: KeyList,
    }

    impl KeySource for Flaky {
        type Error = Unreachable;

        async fn count_hint(&self) -> Result<Option<u64>, Unreachable> {
            Ok(None)
        }

        fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Unreachable>> {
            if self.attempts.fetch_add(1, Ordering::SeqCst) < self.failures {
                stream::iter([Err(Unreachable)]).boxed()
            } else {
                self.keys
                    .keys()
                    .map(|batch| batch.map_err(|never| match never {}))
                    .boxed()
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn warm_up_retries_and_stays_open_meanwhile() {
        let guard = BloomGuard::builder().build();
        let source = Flaky {
            failures: 3,
            attempts: AtomicUsize::new(0),
            keys: KeyList::new(["a"]),
        };
        let warming = tokio::spawn(guard.clone().warm(source));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = guard.stats();
        assert_eq!(stats.state, State::Degraded);
        assert_eq!(
            stats.last_error.as_deref(),
            Some("the key source failed: database unreachable")
        );
        assert!(
            guard.may_contain("anything"),
            "a degraded guard must fail open"
        );

        warming.await.expect("warm-up task");
        let stats = guard.stats();
        assert_eq!(
            (stats.state, stats.generation, stats.last_error),
            (State::Ready, 1, None)
        );
        assert!(!guard.may_contain("anything"));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_pauses_grow_up_to_the_cap() {
        let guard = BloomGuard::builder()
            .max_retry_delay(Duration::from_secs(2))
            .build();
        let source = Flaky {
            failures: 8,
            attempts: AtomicUsize::new(0),
            keys: KeyList::new(["a"]),
        };
        let started = tokio::time::Instant::now();
        guard.clone().warm(source).await;
        // Pauses of 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2, 2 s, each jittered by ±50%.
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs_f64(9.1 * 0.5), "{elapsed:?}");
        assert!(elapsed <= Duration::from_secs_f64(9.1 * 1.5), "{elapsed:?}");
    }

    /// Yields one batch, then waits for a signal before the next: the window
    /// in which a write lands during the scan.
    struct Paused {
        resume: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
        scanning: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    }

    impl KeySource for Paused {
        type Error = Unreachable;

        async fn count_hint(&self) -> Result<Option<u64>, Unreachable> {
            Ok(Some(2))
        }

        fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Unreachable>> {
            let resume = self.resume.lock().unwrap().take().expect("scanned once");
            let scanning = self.scanning.lock().unwrap().take().expect("scanned once");
            let first = stream::iter([Ok(["old"].into_iter().collect::<KeyBatch>())]);
            let second = stream::once(async move {
                let _ = scanning.send(());
                let _ = resume.await;
                Ok(["also-old"].into_iter().collect::<KeyBatch>())
            });
            first.chain(second).boxed()
        }
    }

    #[tokio::test]
    async fn writes_during_a_scan_reach_the_new_filter() {
        let guard = BloomGuard::builder().write_window(Duration::ZERO).build();
        guard
            .rebuild(&KeyList::new(["old"]))
            .await
            .expect("first build");
        let (resume_tx, resume_rx) = oneshot::channel();
        let (scanning_tx, scanning_rx) = oneshot::channel();
        let source = Paused {
            resume: std::sync::Mutex::new(Some(resume_rx)),
            scanning: std::sync::Mutex::new(Some(scanning_tx)),
        };
        let rebuild = {
            let guard = guard.clone();
            tokio::spawn(async move { guard.rebuild(&source).await.map(|s| s.generation) })
        };
        scanning_rx.await.expect("scan started");
        // The row commits after the scan's snapshot: only the double write
        // brings it into the new filter.
        guard.insert("written-during-scan");
        resume_tx.send(()).expect("resume");
        assert_eq!(rebuild.await.expect("rebuild task").expect("rebuild"), 2);
        assert!(guard.may_contain("written-during-scan"));
        assert!(guard.may_contain("also-old"));
    }

    #[tokio::test]
    async fn writes_shortly_before_a_build_are_replayed_into_it() {
        let guard = BloomGuard::builder().build();
        guard
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("first build");
        // Inserted, but its row is not in the source yet (still committing).
        guard.insert("committing");
        guard
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("second build");
        assert!(guard.may_contain("committing"));

        let forgetful = BloomGuard::builder().write_window(Duration::ZERO).build();
        forgetful
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("first build");
        forgetful.insert("committing");
        std::thread::sleep(Duration::from_millis(2));
        forgetful
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("second build");
        assert!(
            !forgetful.may_contain("committing"),
            "the window bounds the replay"
        );
    }

    #[tokio::test]
    async fn a_failed_rebuild_keeps_the_filter_in_use() {
        let guard = BloomGuard::builder().build();
        guard
            .rebuild(&KeyList::new(["kept"]))
            .await
            .expect("first build");
        let failing = Flaky {
            failures: 1,
            attempts: AtomicUsize::new(0),
            keys: KeyList::new(["other"]),
        };
        assert!(guard.rebuild(&failing).await.is_err());
        let stats = guard.stats();
        assert_eq!((stats.state, stats.generation), (State::Ready, 1));
        assert!(stats.last_error.is_some());
        assert!(guard.may_contain("kept"));
        assert!(!guard.may_contain("other"));
    }

    #[tokio::test]
    async fn an_undercounted_source_is_built_again_at_its_size() {
        let keys: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
        struct Undercounted(KeyList);
        impl KeySource for Undercounted {
            type Error = std::convert::Infallible;
            async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
                Ok(Some(10))
            }
            fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
                self.0.keys()
            }
        }
        let guard = BloomGuard::builder().expected_items(1).build();
        guard.clone().warm(Undercounted(KeyList::new(&keys))).await;
        let stats = guard.stats();
        assert_eq!(stats.generation, 2);
        assert!(
            stats.capacity >= 20_000 && stats.estimated_fpp < 0.002,
            "{stats:?}"
        );
    }
}
