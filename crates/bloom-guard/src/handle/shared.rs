//! The state every clone of a guard shares, each piece behind its own
//! type: the filters (`filters/`), the builds (`lifecycle::single_flight`),
//! the health (`handle::health`), the control state (`control::membership`)
//! and the request counters (`report::counters`). What changes more than
//! one of them at once lives here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::control::membership::Control;
use crate::error::BuildError;
use crate::filters::filter::Filter;
use crate::filters::filter_set::FilterSet;
use crate::handle::config::Config;
use crate::handle::health::Health;
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::lifecycle::barrier::Barrier;
use crate::lifecycle::catch_up::{CatchUp, Promote};
use crate::lifecycle::single_flight::Builds;
use crate::lock::lock;
use crate::report::counters::Counters;
use crate::report::metrics::{FilterFigures, GuardMetrics};
use crate::report::stats::{FeedStatus, FeedStorage, FilterOrigin, GuardState, Stats};

/// The figures of `filter`, whose estimated rate is `estimated_fpp`.
fn figures(filter: &Filter, estimated_fpp: f64) -> FilterFigures {
    FilterFigures {
        keys: filter.keys(),
        capacity: filter.capacity(),
        skipped: filter.skipped(),
        bits: filter.bits(),
        hashes: filter.hashes(),
        sub_filters: filter.stage_count(),
        estimated_fpp,
    }
}

/// A filter above its false-positive bound, refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Overfull {
    pub(crate) estimated_fpp: f64,
    pub(crate) bound: f64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The filter in use and the filters being built.
    pub(crate) filters: FilterSet,
    pub(crate) builds: Builds,
    /// The read barrier before every refusal.
    pub(crate) barrier: Arc<Barrier>,
    pub(crate) health: Health,
    pub(crate) control: Control,
    pub(crate) counters: Counters,
    /// The filter's and the guard's gauges.
    pub(crate) metrics: GuardMetrics,
    /// A change feed follows the guard: its builds make counting filters,
    /// and its write path's keys go to the journal only.
    fed: AtomicBool,
    /// How the followers bring a new filter up to date, by reader id.
    catch_ups: CatchUps,
}

/// The followers' catch-ups, by reader id.
#[derive(Default)]
struct CatchUps(Mutex<Vec<(u64, Arc<dyn CatchUp>)>>);

impl std::fmt::Debug for CatchUps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatchUps")
            .field("followers", &lock(&self.0).len())
            .finish()
    }
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            filters: FilterSet::new(config.write_window),
            builds: Builds::default(),
            barrier: Arc::new(Barrier::new(config.read_barrier, config.read_pace.clone())),
            health: Health::new(config.name),
            control: Control::new(config.name, config.mode, config.audit_rate),
            counters: Counters::new(config.name),
            metrics: GuardMetrics::new(config.name, config.target_fpp, config.mode),
            fed: AtomicBool::new(false),
            catch_ups: CatchUps::default(),
            config,
        }
    }

    /// Marks the guard as followed by a change feed.
    pub(crate) fn set_fed(&self) {
        self.fed.store(true, Ordering::Release);
    }

    /// Whether a change feed follows the guard.
    pub(crate) fn fed(&self) -> bool {
        self.fed.load(Ordering::Acquire)
    }

    /// Whether its builds make counting filters: a feed follows it, it
    /// was not told to keep Bloom filters, and the CPU runs them.
    pub(crate) fn counts_rows(&self) -> bool {
        self.fed() && self.config.forget_deleted && crate::filters::counting::supported()
    }

    pub(crate) fn add_catch_up(&self, reader: u64, catch_up: Arc<dyn CatchUp>) {
        let mut catch_ups = lock(&self.catch_ups.0);
        catch_ups.retain(|(id, _)| *id != reader);
        catch_ups.push((reader, catch_up));
    }

    pub(crate) fn remove_catch_up(&self, reader: u64) {
        lock(&self.catch_ups.0).retain(|(id, _)| *id != reader);
    }

    /// The catch-up of the guard's one follower; none with several (one
    /// scan position cannot stand for two feeds: their filters are built
    /// inexact, and keep deleted keys until a rebuild without).
    pub(crate) fn catch_up(&self) -> Option<Arc<dyn CatchUp>> {
        match lock(&self.catch_ups.0).as_slice() {
            [(_, catch_up)] => Some(Arc::clone(catch_up)),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn may_contain(&self, key: &Key<'_>) -> bool {
        if self.health.lets_all_through() {
            return true;
        }
        match &*self.filters.current() {
            Some(filter) => filter.contains(key) || self.filters.journaled(key),
            None => true,
        }
    }

    /// The inner service found a key the filter said was absent.
    pub(crate) fn record_false_negative(&self, key: &[u8]) {
        self.counters.false_negative(key);
        if self.config.rebuild_on_false_negative && self.health.suspect_filter() {
            self.metrics.state(self.health.state());
        }
    }

    /// Counts a false positive, unless every request passes anyway (no
    /// filter yet, or held open): then a miss says nothing of the filter.
    pub(crate) fn record_false_positive(&self) {
        if self.filters.current().is_some() && !self.health.held_open() {
            self.counters.false_positive();
        }
    }

    /// The highest estimated false-positive rate a filter in use may have.
    pub(crate) fn fpp_bound(&self) -> f64 {
        self.config.rebuild_above * self.config.target_fpp
    }

    /// Whether the filter in use passed the rate bound (reads its bits:
    /// for the maintenance interval, not for requests); refreshes the
    /// filter's metrics.
    pub(crate) fn overfull(&self) -> bool {
        let Some(filter) = self.filters.current().as_ref().map(Arc::clone) else {
            return false;
        };
        let fpp = filter.estimated_fpp();
        self.metrics.filter(&figures(&filter, fpp));
        let overfull = fpp > self.fpp_bound();
        if self.health.set_overfull(overfull) {
            if overfull {
                tracing::warn!(
                    guard = self.config.name,
                    estimated_fpp = fpp,
                    bound = self.fpp_bound(),
                    "the filter passed its false-positive bound; a rebuild is due"
                );
            }
            self.metrics.state(self.health.state());
        }
        overfull
    }

    pub(crate) fn hold_open(&self) {
        self.health.hold_open();
        self.metrics.state(self.health.state());
    }

    pub(crate) fn release_open(&self) {
        self.health.release_open();
        self.metrics.state(self.health.state());
    }

    pub(crate) fn record_failure(&self, error: String) {
        self.health.record_failure(error);
        self.metrics.state(self.health.state());
    }

    pub(crate) fn record_feed(&self, status: FeedStatus) {
        let lag = status.lag_ms;
        self.metrics.feed_read(self.health.record_feed(status), lag);
    }

    pub(crate) fn record_feed_storage(&self, storage: FeedStorage) {
        self.metrics.feed_storage(&storage);
        self.health.record_storage(storage);
    }

    /// Inserts a key of this instance's write path: into the journal, and
    /// unless the guard builds counting filters (which take each row from
    /// the feed), into the filter in use and every filter being built.
    pub(crate) fn insert(&self, key: &Key<'_>) {
        let key = &self.config.key_type.canonical_or_same(Key::from(key));
        let read = self.barrier.journal_read();
        if let Some(filter) = &*self.filters.insert(key, self.counts_rows(), read) {
            self.metrics.keys(filter.keys(), filter.skipped());
        }
    }

    /// Inserts committed keys (a change feed's) into the filter in use and
    /// every filter being built that takes them.
    pub(crate) fn insert_batch(&self, batch: &KeyBatch) {
        let batch = &*self.config.key_type.canonical_batch(batch);
        if let Some(filter) = &*self
            .filters
            .insert_batch(batch, self.barrier.read_in_progress())
        {
            self.metrics.keys(filter.keys(), filter.skipped());
        }
    }

    /// Applies a read of the change feed (from position `from` to
    /// `reached`) to the filter in use and the filters being built that
    /// take live keys: see [`FilterSet::apply`].
    pub(crate) fn apply_changes(
        &self,
        added: &KeyBatch,
        removed: &KeyBatch,
        from: Option<&str>,
        reached: Option<&str>,
    ) {
        let key_type = self.config.key_type;
        let current = self.filters.apply(
            &key_type.canonical_batch(added),
            &key_type.canonical_batch(removed),
            (from, reached),
            self.barrier.read_in_progress(),
        );
        if let Some(filter) = &*current {
            self.metrics.keys(filter.keys(), filter.skipped());
        }
    }

    /// Puts a registered filter in use and returns its generation, unless
    /// its estimated false-positive rate is above the bound: an overfull
    /// filter is never put in use.
    pub(crate) fn promote(
        &self,
        filter: &Arc<Filter>,
        origin: FilterOrigin,
    ) -> Result<u64, Overfull> {
        let estimated_fpp = filter.estimated_fpp();
        if estimated_fpp > self.fpp_bound() {
            return Err(Overfull {
                estimated_fpp,
                bound: self.fpp_bound(),
            });
        }
        self.filters.promote(filter);
        let generation = self.health.promoted(origin);
        self.metrics
            .built(&figures(filter, estimated_fpp), generation);
        self.metrics.state(self.health.state());
        Ok(generation)
    }

    /// The filter in use, unless the guard lets every request through (a
    /// hold, a suspected false negative): only then does it hold every key.
    pub(crate) fn complete_filter(&self) -> Option<Arc<Filter>> {
        if self.health.state() != GuardState::Ready {
            return None;
        }
        self.filters.current().as_ref().map(Arc::clone)
    }

    /// Makes the counting filter in use keep deleted keys from now on (a
    /// second follower joined: its reads are not the first's).
    pub(crate) fn filter_no_longer_exact(&self) {
        if let Some(counting) = self.filters.current().as_deref().and_then(Filter::counting) {
            counting.set_exact(false);
        }
    }

    /// Whether the counting filter in use spilled keys past its last
    /// stage into its exact overflow table.
    pub(crate) fn overflowed(&self) -> bool {
        self.filters
            .current()
            .as_deref()
            .and_then(Filter::counting)
            .is_some_and(|counting| counting.overflowed())
    }

    /// Whether the counting filter in use met a deleted row's key it did
    /// not hold: it and the feed disagree.
    pub(crate) fn counting_missed(&self) -> bool {
        self.filters
            .current()
            .as_deref()
            .and_then(Filter::counting)
            .is_some_and(|counting| counting.missed() > 0)
    }

    /// Whether the filter in use is a counting one.
    pub(crate) fn counting(&self) -> bool {
        self.filters
            .current()
            .as_deref()
            .is_some_and(|filter| filter.counting().is_some())
    }

    /// The sub-filters of the filter in use, 0 if none.
    pub(crate) fn sub_filters(&self) -> usize {
        self.filters
            .current()
            .as_deref()
            .map_or(0, Filter::stage_count)
    }

    pub(crate) fn stats(&self) -> Stats {
        let current = self.filters.current();
        let filter = current.as_deref();
        let counts = self.counters.counts();
        let last_build = self.health.last_build();
        let (mode_set_by, audit_rate_set_by) = self.control.set_by();
        Stats {
            state: self.health.state(),
            reason: self.health.reason(),
            generation: self.health.generation(),
            keys: filter.map_or(0, Filter::keys),
            capacity: filter.map_or(0, Filter::capacity),
            bits: filter.map_or(0, Filter::bits),
            hashes: filter.map_or(0, Filter::hashes),
            fill: filter.map_or(0.0, Filter::fill),
            target_fpp: self.config.target_fpp,
            estimated_fpp: filter.map_or(0.0, Filter::estimated_fpp),
            sub_filters: filter.map_or(0, |filter| filter.stage_count() as u32),
            observed_fpp: counts.observed_fpp(),
            passed: counts.passed,
            rejected: counts.rejected,
            false_positives: counts.false_positives,
            bad_keys: counts.bad_keys,
            unchecked: counts.unchecked,
            unguarded: counts.unguarded,
            mode: self.control.mode(),
            mode_set_by,
            audit_rate: self.control.audit_rate(),
            audit_rate_set_by,
            shadow_would_reject: counts.shadow_would_reject,
            audited: counts.audited,
            shadow_false_negatives: counts.false_negatives,
            barrier_waits: counts.barrier_waits,
            barrier_found: counts.barrier_found,
            barrier_timeouts: counts.barrier_timeouts,
            skipped_keys: filter.map_or(0, Filter::skipped),
            filter_kind: filter.map(Filter::kind),
            deletes_applied: filter
                .and_then(Filter::counting)
                .map_or(0, |counting| counting.removed()),
            deletes_left: filter
                .and_then(Filter::counting)
                .map_or(0, |counting| counting.unapplied() + counting.kept()),
            last_error: self.health.last_error(),
            origin: last_build.map(|(_, origin)| origin),
            age_ms: last_build.map(|(at, _)| at.elapsed().as_millis() as u64),
            feed: self.health.feed(),
        }
    }
}

impl Promote for Shared {
    fn promote_pending(
        &self,
        filter: &Arc<Filter>,
        origin: FilterOrigin,
    ) -> Result<u64, BuildError> {
        self.promote(filter, origin)
            .map_err(|overfull| BuildError::Overfull {
                estimated_fpp: overfull.estimated_fpp,
                bound: overfull.bound,
            })
    }
}
