//! Building filters from a `KeySource`: warm-up, rebuilds, and the
//! maintenance that triggers them.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;
use tracing::Instrument;

use crate::error::{error_chain, BuildError};
use crate::handle::feed::FeedHandle;
use crate::handle::guard::BloomGuard;
use crate::lifecycle::scan::scan;
use crate::lifecycle::single_flight::InFlight;
use crate::lifecycle::source::KeySource;
use crate::lock::lock;
use crate::report::stats::Stats;

impl BloomGuard {
    /// Loads every key of `source` into a first filter, retrying until it
    /// succeeds, and returns once the filter is in use.
    ///
    /// The guard fails open meanwhile. A failing source is retried with
    /// jittered exponential backoff from 100 ms up to
    /// [`Builder::max_retry_delay`](crate::Builder::max_retry_delay), each
    /// failure logged once and shown in [`Stats::last_error`]; the state is
    /// `degraded` until an attempt succeeds. Progress (keys, keys/s) is
    /// logged every few seconds. The filter is sized from the source's
    /// count hint; if the source holds more keys, the filter grows
    /// sub-filters for them as the scan reads them: one scan, whatever the
    /// hint said.
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
        self.warm_expecting(source, 0).await;
    }

    /// Like [`warm`](Self::warm), with the filter sized for at least
    /// `keys`: for a caller that knows better than the source's count hint
    /// (a snapshot's key count plus the change feed since it).
    pub async fn warm_expecting<S: KeySource>(self, source: S, keys: u64) {
        let mut pauses = retry_pauses(self.shared.config.max_retry_delay);
        while self.build(&source, keys).await.is_err() {
            let pause = pauses.next().unwrap_or(self.shared.config.max_retry_delay);
            tracing::info!(guard = self.name(), retry_in = ?pause, "bloom filter warm-up will retry");
            tokio::time::sleep(pause).await;
        }
    }

    /// Builds a new filter from `source` and swaps it in.
    ///
    /// The new filter is sized from the source's count hint with headroom and
    /// gets a fresh random hasher key. It is registered for every
    /// [`insert`](Self::insert) before its scan starts, so a key inserted
    /// while the scan runs is in it whether or not the scan sees its row;
    /// a sample of the scanned keys is checked in it, then it replaces the
    /// filter in use atomically and the generation goes up. If anything
    /// fails, the filter in use stays.
    ///
    /// One rebuild at a time: a call made while one is in flight joins it
    /// and gets its result, so concurrent callers cause one scan.
    ///
    /// # Errors
    ///
    /// [`BuildError::Source`] if the source fails; it is also logged and
    /// shown in [`Stats::last_error`]. [`BuildError::Cancelled`] if the
    /// rebuild this call joined was dropped by its caller.
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
        self.rebuild_joining(source, |_| true).await
    }

    async fn rebuild_joining<S: KeySource>(
        &self,
        source: &S,
        fresh_enough: impl Fn(tokio::time::Instant) -> bool,
    ) -> Result<Stats, BuildError> {
        loop {
            let (leader, mut result, joinable) = {
                let mut slot = lock(&self.shared.builds.in_flight);
                match &*slot {
                    Some((started, in_flight)) => (None, in_flight.clone(), fresh_enough(*started)),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        *slot = Some((tokio::time::Instant::now(), rx.clone()));
                        (
                            Some(InFlight {
                                builds: &self.shared.builds,
                                tx,
                            }),
                            rx,
                            true,
                        )
                    }
                }
            };
            if let Some(leader) = leader {
                let outcome = self.build(source, 0).await.map(|_| self.stats());
                leader.finish(outcome.clone());
                return outcome;
            }
            let outcome = loop {
                if let Some(outcome) = result.borrow_and_update().clone() {
                    break outcome;
                }
                if result.changed().await.is_err() {
                    break Err(BuildError::Cancelled);
                }
            };
            if joinable {
                return outcome;
            }
        }
    }

    /// Keeps the filter fresh: rebuilds from `source` whenever
    /// [`rebuild_due`](crate::feed::FeedHandle::rebuild_due) says so, checking every
    /// [`Builder::check_interval`](crate::Builder::check_interval). Runs
    /// until dropped; spawn it once the guard is warm.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder()
    ///     .rebuild_interval(Duration::from_secs(3600)) // purge deleted keys hourly
    ///     .build();
    /// let keys = KeyList::new(["a"]);
    /// guard.clone().warm(keys.clone()).await;
    /// tokio::spawn(guard.clone().maintain(keys));
    /// # }
    /// ```
    pub async fn maintain<S: KeySource>(self, source: S) {
        let mut ticks = tokio::time::interval(self.shared.config.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Some(reason) = self.feed().rebuild_due() {
                tracing::info!(reason, "rebuilding the bloom filter");
                let _ = self.rebuild(&source).await;
            }
        }
    }

    async fn build<S: KeySource>(&self, source: &S, floor: u64) -> Result<(), BuildError> {
        let shared = &*self.shared;
        let _one_at_a_time = shared.builds.one_at_a_time.lock().await;
        let started = Instant::now();
        let span = tracing::info_span!("bloom_guard_build", guard = shared.config.name);
        let result = scan(&self.shared, source, floor).instrument(span).await;
        shared
            .metrics
            .build_finished("scan", started.elapsed(), result.is_ok());
        if let Err(error) = &result {
            let message = error_chain(error);
            tracing::warn!(guard = shared.config.name, error = %message, "bloom filter build failed; the filter in use stays");
            shared.record_failure(message);
        }
        result
    }
}

impl FeedHandle<'_> {
    /// Like [`rebuild`](BloomGuard::rebuild), but joins a rebuild in flight only
    /// if it started at or after `since`; an older one is waited for and
    /// then another one runs. For callers that need a scan whose snapshot
    /// is later than some event, such as a listener that just reconnected.
    ///
    /// # Errors
    ///
    /// As [`rebuild`](BloomGuard::rebuild).
    pub async fn rebuild_newer_than<S: KeySource>(
        self,
        source: &S,
        since: tokio::time::Instant,
    ) -> Result<Stats, BuildError> {
        self.guard
            .rebuild_joining(source, |started| started >= since)
            .await
    }

    /// Why the filter should be rebuilt now, if it should: a false negative
    /// was seen (see [`Mode`](crate::Mode)), the
    /// [`Builder::rebuild_interval`](crate::Builder::rebuild_interval) has
    /// passed since the last build (which purges deleted keys from a Bloom
    /// filter), a Bloom filter grew into more sub-filters than
    /// [`Builder::compact_above`](crate::Builder::compact_above), a counting
    /// filter met a deleted row's key it did not hold (it and the feed
    /// disagree) or spilled past its last stage (it grows stages without a
    /// rebuild, over 10^20 keys before that), or its
    /// estimated false-positive rate passed
    /// [`Builder::rebuild_above`](crate::Builder::rebuild_above) times the
    /// target. Reads the filter's bits (for the estimate): call it on an
    /// interval, not per request.
    pub fn rebuild_due(self) -> Option<&'static str> {
        let shared = &*self.guard.shared;
        let config = &shared.config;
        let last_build = shared.health.last_build()?.0;
        if shared.health.suspect() {
            return Some("a false negative was seen");
        }
        if config
            .rebuild_interval
            .is_some_and(|every| last_build.elapsed() >= every)
        {
            return Some("the rebuild interval passed");
        }
        if shared.overfull() {
            return Some("the estimated false-positive rate passed its bound");
        }
        if !shared.counting() && shared.sub_filters() > config.compact_above {
            return Some("the filter grew more sub-filters than compact_above");
        }
        if shared.counting_missed() {
            return Some("a deleted row's key was not in the counting filter");
        }
        if shared.overflowed() {
            return Some("the counting filter spilled past its last stage");
        }
        None
    }
}

/// The pauses between attempts: from 100 ms, doubling up to `max`, each
/// lengthened by a random part of up to as much again, so a fleet
/// restarting together does not retry in step.
fn retry_pauses(max: Duration) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::new()
        .with_jitter()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(max)
        .without_max_times()
        .build()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::stream::{self, BoxStream, StreamExt};
    use tokio::sync::oneshot;

    use crate::{keys::KeyBatch, stats::GuardState, BloomGuard, KeyList, KeySource};

    #[derive(Debug, thiserror::Error)]
    #[error("database unreachable")]
    struct Unreachable;

    /// A key list that counts its scans, and scans slowly enough for
    /// concurrent callers to overlap.
    pub(crate) struct Counting {
        keys: KeyList,
        scans: std::sync::Arc<AtomicUsize>,
    }

    impl Counting {
        pub(crate) fn new<const N: usize>(keys: [&str; N]) -> Self {
            Self {
                keys: KeyList::new(keys),
                scans: std::sync::Arc::default(),
            }
        }

        pub(crate) fn scans(&self) -> std::sync::Arc<AtomicUsize> {
            std::sync::Arc::clone(&self.scans)
        }
    }

    impl KeySource for Counting {
        type Error = std::convert::Infallible;

        async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.keys.count_hint().await
        }

        fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
            self.scans.fetch_add(1, Ordering::SeqCst);
            self.keys.keys()
        }
    }

    #[tokio::test]
    async fn concurrent_rebuilds_run_one_scan() {
        let guard = BloomGuard::builder().build();
        let source = Counting::new(["a"]);
        let rebuilds = (0..10).map(|_| guard.rebuild(&source));
        for outcome in futures_util::future::join_all(rebuilds).await {
            assert_eq!(outcome.expect("rebuild").generation, 1);
        }
        assert_eq!(source.scans().load(Ordering::SeqCst), 1);
        // Once it is over, the next call scans again.
        assert_eq!(guard.rebuild(&source).await.expect("rebuild").generation, 2);
        assert_eq!(source.scans().load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn joiners_of_a_cancelled_rebuild_are_told() {
        let guard = BloomGuard::builder().build();
        let source = Counting::new(["a"]);
        let leader = guard.rebuild(&source);
        let joiner = async {
            tokio::task::yield_now().await;
            guard.rebuild(&source).await
        };
        let leader = async {
            // Dropped after its first poll, mid-build.
            let _ = tokio::time::timeout(Duration::from_millis(10), leader).await;
        };
        let ((), joined) = tokio::join!(leader, joiner);
        assert!(
            matches!(joined, Err(crate::BuildError::Cancelled)),
            "{joined:?}"
        );
        assert_eq!(guard.rebuild(&source).await.expect("rebuild").generation, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn maintain_rebuilds_on_schedule_and_when_outgrown() {
        let guard = BloomGuard::builder()
            .expected_items(100)
            .headroom(0.1)
            .rebuild_interval(Duration::from_secs(60))
            .check_interval(Duration::from_secs(1))
            .build();
        let source = Counting::new(["a"]);
        guard.rebuild(&source).await.expect("first build");
        assert_eq!(guard.feed().rebuild_due(), None);
        tokio::spawn(guard.clone().maintain(Counting::new(["a"])));

        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(guard.stats().generation, 2, "scheduled rebuild");

        // 2 000 keys into a filter sized for 110: it grows sub-filters of
        // 220, 440, 880 and 1 760 keys and keeps its rate, until it has more
        // sub-filters than compact_above (4) allows.
        for i in 0..2000 {
            guard.insert(format!("new-{i}"));
        }
        let grown = guard.stats();
        assert_eq!(grown.sub_filters, 5, "{grown:?}");
        // Each full sub-filter's realized rate scatters around its share;
        // the compound stays well within twice the target.
        assert!(grown.estimated_fpp <= 1.5 * grown.target_fpp, "{grown:?}");
        assert_eq!(
            guard.feed().rebuild_due(),
            Some("the filter grew more sub-filters than compact_above")
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stats = guard.stats();
        assert_eq!(stats.generation, 3, "a compaction");
        assert_eq!(stats.sub_filters, 1, "{stats:?}");
        assert!(stats.estimated_fpp < stats.target_fpp, "{stats:?}");
        assert!((0..2000).all(|i| guard.may_contain(format!("new-{i}"))));
    }

    #[tokio::test]
    async fn ready_means_protecting_and_stays_ready() {
        let guard = BloomGuard::builder().build();
        let hold = guard.fail_open();
        guard
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("first build");
        let stats = guard.stats();
        assert!(!guard.is_ready(), "a filter that may lack keys");
        assert_eq!(stats.state, GuardState::Warming);
        assert!(stats.reason.is_some(), "{stats:?}");
        assert!(guard.may_contain("absent"), "fails open meanwhile");

        let ready = tokio::spawn({
            let guard = guard.clone();
            async move { guard.ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!ready.is_finished());
        drop(hold);
        ready.await.expect("ready");
        assert!(guard.is_ready());
        assert_eq!(
            (guard.stats().state, guard.stats().reason),
            (GuardState::Ready, None)
        );
        assert!(!guard.may_contain("absent"));

        // After the first ready, a degradation shows in the state only.
        let hold = guard.feed().fail_open_because("a gap in the feed");
        let stats = guard.stats();
        assert_eq!(stats.state, GuardState::Degraded);
        assert_eq!(stats.reason.as_deref(), Some("a gap in the feed"));
        assert!(guard.is_ready());
        guard.ready().await;
        drop(hold);
    }

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
        assert_eq!(stats.state, GuardState::Degraded);
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
            (GuardState::Ready, 1, None)
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
        // Pauses of 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2, 2 s, each lengthened by
        // jitter of less than itself (and the timer's millisecond each).
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs_f64(9.1), "{elapsed:?}");
        assert!(
            elapsed < Duration::from_secs_f64(9.1 * 2.0 + 0.01),
            "{elapsed:?}"
        );
    }

    #[test]
    fn retry_pauses_start_at_100_ms_and_double_up_to_the_cap() {
        let cap = Duration::from_secs(2);
        let mut unjittered = Duration::from_millis(100);
        for pause in super::retry_pauses(cap).take(12) {
            // The doubling is computed in f32: allow it a microsecond.
            let floor = unjittered.saturating_sub(Duration::from_micros(1));
            assert!(pause >= floor, "{pause:?} < {unjittered:?}");
            assert!(pause < unjittered * 2, "{pause:?} >= 2 x {unjittered:?}");
            unjittered = (unjittered * 2).min(cap);
        }
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
        // (or the feed, on other instances) brings it into the new filter.
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
    async fn keys_from_a_feed_are_not_journaled() {
        let guard = BloomGuard::builder().build();
        guard
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("first build");
        // Committed keys: the next scan has their rows, or they were deleted.
        guard.insert_batch(&["committed"].into_iter().collect());
        assert!(guard.may_contain("committed"));
        guard
            .rebuild(&KeyList::new(["a"]))
            .await
            .expect("second build");
        assert!(!guard.may_contain("committed"));
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
        assert_eq!((stats.state, stats.generation), (GuardState::Ready, 1));
        assert!(stats.last_error.is_some());
        assert!(guard.may_contain("kept"));
        assert!(!guard.may_contain("other"));
    }

    #[tokio::test]
    async fn an_undercounted_source_is_scanned_once() {
        let keys: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
        struct Undercounted(KeyList);
        impl KeySource for Undercounted {
            type Error = std::convert::Infallible;
            async fn count_hint(&self) -> Result<Option<u64>, Self::Error> {
                Ok(Some(1_000))
            }
            fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
                self.0.keys()
            }
        }
        let guard = BloomGuard::builder().expected_items(1).build();
        guard.clone().warm(Undercounted(KeyList::new(&keys))).await;
        let stats = guard.stats();
        assert_eq!(stats.generation, 1, "one scan");
        // 1 250, 2 500, 5 000, 10 000 and 20 000 keys of room.
        assert_eq!(stats.sub_filters, 5, "{stats:?}");
        assert!(stats.estimated_fpp <= stats.target_fpp, "{stats:?}");
        assert!(keys.iter().all(|key| guard.may_contain(key)));
        assert!(guard.is_ready());
    }
}
