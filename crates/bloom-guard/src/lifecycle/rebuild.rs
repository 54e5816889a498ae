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
pub(crate) mod tests;
