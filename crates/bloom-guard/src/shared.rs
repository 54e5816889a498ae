//! The state every clone of a guard shares: the filter in use, the filters
//! being built, and the counters.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::config::Config;
use crate::counter::Counter;
use crate::error::BuildError;
use crate::filter::Filter;
use crate::filter_set::FilterSet;
use crate::fleet::Fleet;
use crate::key::{Key, KeyError};
use crate::lock::lock;
use crate::metrics::{FilterFigures, GuardMetrics, UNCHECKED_REASONS};
use crate::mode::Mode;
use crate::settings::{Layers, SetBy, Settings};
use crate::source::KeyBatch;
use crate::stats::{FeedStatus, FilterOrigin, GuardState, Stats, UncheckedCounts};

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

/// A guard's fleet, in a slot `Shared`'s `Debug` can show.
struct FleetSlot(Arc<dyn Fleet>);

impl std::fmt::Debug for FleetSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fleet")
    }
}

/// A filter above its false-positive bound, refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Overfull {
    pub(crate) estimated_fpp: f64,
    pub(crate) bound: f64,
}

/// False negatives logged with their key; the rest are only counted.
const LOGGED_FALSE_NEGATIVES: u64 = 10;

/// The result of the rebuild in flight, for the callers that joined it.
pub(crate) type RebuildResult = Option<Result<Stats, BuildError>>;

/// The rebuild in flight: when it started, and where its result appears.
pub(crate) type RebuildSlot = Option<(tokio::time::Instant, watch::Receiver<RebuildResult>)>;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The filter in use and the filters being built.
    pub(crate) filters: FilterSet,
    /// Reasons to let every request through although a filter is in use
    /// (a follower catching up on lost notifications).
    held_open: AtomicUsize,
    generation: AtomicU64,
    passed: Counter,
    rejected: Counter,
    bad_keys: Counter,
    /// By [`unchecked_index`].
    unchecked: [Counter; UNCHECKED_REASONS.len()],
    unguarded: Counter,
    shadow_would_reject: Counter,
    audited: Counter,
    false_negatives: Counter,
    /// The mode and audit rate, by layer and in force.
    pub(crate) settings: Layers,
    /// The fleets the guard joined (its followers'), the last one in use.
    fleet: Mutex<Vec<FleetSlot>>,
    /// A false negative was seen: the filter in use is not trusted until
    /// the next one is put in place.
    suspect: AtomicBool,
    /// Whether the guard has protected once: its first filter held every
    /// key within the rate bound. Never reset (see [`Self::ready`]).
    protected: AtomicBool,
    /// The filter in use passed the rate bound (seen by the last
    /// [`Self::overfull`] check); it still answers, and a rebuild is due.
    overfull: AtomicBool,
    /// Whether the first unguarded request was logged.
    warned_unguarded: AtomicBool,
    false_positives: Counter,
    /// The generation in use, for [`ready`](Self::ready) to wait on.
    generations: watch::Sender<u64>,
    last_error: Mutex<Option<String>>,
    /// Why a hold keeps the guard open, if it said.
    hold_reasons: Mutex<Vec<(u64, String)>>,
    /// The id of the next hold with a reason.
    next_hold: AtomicU64,
    /// What the change feed reported last.
    feed: Mutex<Option<(FeedStatus, tokio::time::Instant)>>,
    /// When the filter in use was put in place (tokio's clock, which tests
    /// can pause), and where it came from.
    last_build: Mutex<Option<(tokio::time::Instant, FilterOrigin)>>,
    /// One build at a time.
    pub(crate) build_lock: tokio::sync::Mutex<()>,
    /// The rebuild in flight, which later callers join.
    pub(crate) rebuild_in_flight: Mutex<RebuildSlot>,
    pub(crate) metrics: GuardMetrics,
}

/// The slot of an unchecked reason in the counters and in
/// [`UNCHECKED_REASONS`]; `None` for an unguardable request, counted apart.
fn unchecked_index(why: &KeyError) -> Option<usize> {
    Some(match why {
        KeyError::TooLong { .. } => 0,
        KeyError::NotUtf8 => 1,
        KeyError::Ambiguous => 2,
        KeyError::NotOfKeyType => 3,
        KeyError::Uncomparable => 4,
        KeyError::Unguardable(_) => return None,
    })
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Self {
            filters: FilterSet::new(config.write_window),
            metrics: GuardMetrics::new(config.name, config.target_fpp, config.mode),
            settings: Layers::new(config.mode, config.audit_rate),
            fleet: Mutex::new(Vec::new()),
            config,
            held_open: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            passed: Counter::default(),
            rejected: Counter::default(),
            bad_keys: Counter::default(),
            unchecked: Default::default(),
            unguarded: Counter::default(),
            shadow_would_reject: Counter::default(),
            audited: Counter::default(),
            false_negatives: Counter::default(),
            suspect: AtomicBool::new(false),
            protected: AtomicBool::new(false),
            overfull: AtomicBool::new(false),
            warned_unguarded: AtomicBool::new(false),
            false_positives: Counter::default(),
            generations: watch::Sender::new(0),
            last_error: Mutex::new(None),
            hold_reasons: Mutex::new(Vec::new()),
            next_hold: AtomicU64::new(0),
            feed: Mutex::new(None),
            last_build: Mutex::new(None),
            build_lock: tokio::sync::Mutex::new(()),
            rebuild_in_flight: Mutex::new(None),
        }
    }

    #[inline]
    pub(crate) fn may_contain(&self, key: &Key<'_>) -> bool {
        if self.held_open.load(Ordering::Acquire) > 0 || self.suspect.load(Ordering::Acquire) {
            return true;
        }
        match &*self.filters.current() {
            Some(filter) => filter.contains(key),
            None => true,
        }
    }

    pub(crate) fn has_filter(&self) -> bool {
        self.filters.current().is_some()
    }

    pub(crate) fn count_passed(&self) {
        self.passed.increment();
        self.metrics.passed.increment(1);
    }

    pub(crate) fn count_rejected(&self) {
        self.rejected.increment();
        self.metrics.rejected.increment(1);
    }

    pub(crate) fn count_bad_key(&self) {
        self.bad_keys.increment();
        self.metrics.bad_keys.increment(1);
    }

    /// Counts a request passed on without a lookup, by why.
    pub(crate) fn count_unchecked(&self, why: &KeyError) {
        match unchecked_index(why) {
            Some(index) => {
                self.unchecked[index].increment();
                self.metrics.unchecked[index].increment(1);
            }
            None => {
                if let KeyError::Unguardable(why) = why {
                    self.count_unguarded(why);
                }
            }
        }
    }

    /// Counts a request the layer could not check, and logs the first.
    pub(crate) fn count_unguarded(&self, why: &'static str) {
        self.unguarded.increment();
        self.metrics.unguarded.increment(1);
        if !self.warned_unguarded.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                guard = self.config.name,
                why,
                "a guarded route passes requests unchecked; see Stats::unguarded"
            );
        }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.settings.mode()
    }

    /// Changes this instance's overrides (see [`Layers::update`]).
    pub(crate) fn override_settings(&self, settings: Settings) {
        let change = self.settings.set_overrides(settings);
        self.mode_changed(change.from, change.to, SetBy::Instance);
    }

    /// Changes the fleet's settings from here.
    pub(crate) fn set_fleet_settings(&self, settings: Settings, replace: bool) {
        let change = self.settings.set_fleet(settings, replace);
        self.mode_changed(change.from, change.to, SetBy::Fleet);
    }

    /// Puts the fleet's stored settings in force, unless they were changed
    /// from here since `epoch`.
    pub(crate) fn apply_stored_settings(&self, settings: Settings, epoch: u64) {
        if let Some(change) = self.settings.apply_stored(settings, epoch) {
            self.mode_changed(change.from, change.to, SetBy::Fleet);
        }
    }

    /// Drops this instance's overrides.
    pub(crate) fn clear_overrides(&self) {
        let change = self.settings.clear_overrides();
        self.mode_changed(change.from, change.to, self.settings.set_by().0);
    }

    fn mode_changed(&self, from: Mode, to: Mode, by: SetBy) {
        if from != to {
            self.metrics.mode(to);
            tracing::info!(guard = self.config.name, %from, %to, by = by.as_str(), "guard mode changed");
        }
    }

    /// The fleet the guard belongs to, if it joined one: the last joined.
    pub(crate) fn fleet(&self) -> Option<Arc<dyn Fleet>> {
        lock(&self.fleet).last().map(|slot| Arc::clone(&slot.0))
    }

    pub(crate) fn join_fleet(&self, fleet: Arc<dyn Fleet>) {
        lock(&self.fleet).push(FleetSlot(fleet));
    }

    /// Leaves `fleet`; the guard stays in the others it joined.
    pub(crate) fn leave_fleet(&self, fleet: &Arc<dyn Fleet>) {
        let mut fleets = lock(&self.fleet);
        if let Some(at) = fleets
            .iter()
            .rposition(|joined| Arc::ptr_eq(&joined.0, fleet))
        {
            fleets.remove(at);
        }
    }

    pub(crate) fn count_shadow_would_reject(&self) {
        self.shadow_would_reject.increment();
        self.metrics.shadow_would_reject.increment(1);
    }

    pub(crate) fn count_audited(&self) {
        self.audited.increment();
        self.metrics.audited.increment(1);
    }

    /// The inner service found a key the filter said was absent.
    pub(crate) fn record_false_negative(&self, key: &[u8]) {
        let seen = self.false_negatives.get();
        self.false_negatives.increment();
        self.metrics.false_negatives.increment(1);
        // The first few, with their key (never the rest of the request).
        if seen < LOGGED_FALSE_NEGATIVES {
            tracing::error!(
                guard = self.config.name,
                key = %String::from_utf8_lossy(key),
                "false negative: the filter said absent, the service found the key"
            );
        }
        if self.config.rebuild_on_false_negative && !self.suspect.swap(true, Ordering::AcqRel) {
            self.metrics.state(self.state());
            tracing::warn!(
                guard = self.config.name,
                "failing open until the next rebuild, which is due now"
            );
        }
    }

    pub(crate) fn suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// Waits until the guard protects: a filter in use that holds every
    /// key (no hold, no false negative seen) within the rate bound. Once
    /// it has, it stays ready: a later degradation fails the guard open and
    /// shows in [`Self::state`], not here.
    pub(crate) async fn ready(&self) {
        let mut generations = self.generations.subscribe();
        let _ = generations.wait_for(|_| self.is_ready()).await;
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.protected.load(Ordering::Acquire)
    }

    /// Marks the guard ready if it protects now, and wakes its waiters.
    fn check_ready(&self) {
        if self.is_ready()
            || self.state_now() != GuardState::Ready
            || self.overfull.load(Ordering::Acquire)
        {
            return;
        }
        if !self.protected.swap(true, Ordering::AcqRel) {
            tracing::info!(guard = self.config.name, "the guard protects: ready");
            self.generations.send_modify(|_| {});
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
        if overfull != self.overfull.swap(overfull, Ordering::AcqRel) {
            if overfull {
                tracing::warn!(
                    guard = self.config.name,
                    estimated_fpp = fpp,
                    bound = self.fpp_bound(),
                    "the filter passed its false-positive bound; a rebuild is due"
                );
            }
            self.metrics.state(self.state());
        }
        overfull
    }

    /// Counts a false positive, unless every request passes anyway (no
    /// filter yet, or held open): then a miss says nothing of the filter.
    pub(crate) fn count_false_positive(&self) {
        if self.has_filter() && self.held_open.load(Ordering::Acquire) == 0 {
            self.false_positives.increment();
            self.metrics.false_positives.increment(1);
        }
    }

    pub(crate) fn hold_open(&self) {
        self.held_open.fetch_add(1, Ordering::AcqRel);
        self.metrics.state(self.state());
    }

    /// Records why a hold keeps the guard open; its id, to forget it.
    pub(crate) fn add_hold_reason(&self, reason: String) -> u64 {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        lock(&self.hold_reasons).push((id, reason));
        id
    }

    pub(crate) fn remove_hold_reason(&self, id: u64) {
        lock(&self.hold_reasons).retain(|(held, _)| *held != id);
    }

    /// The reasons of the holds that gave one, oldest first.
    fn hold_reason(&self) -> Option<String> {
        let reasons = lock(&self.hold_reasons);
        (!reasons.is_empty()).then(|| {
            reasons
                .iter()
                .map(|(_, reason)| reason.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    pub(crate) fn release_open(&self) {
        self.held_open.fetch_sub(1, Ordering::AcqRel);
        self.metrics.state(self.state());
        self.check_ready();
    }

    /// Inserts a key of this instance's write path into the filter in use,
    /// every filter being built, and the journal.
    pub(crate) fn insert(&self, key: &Key<'_>) {
        let key = &self.config.key_type.canonical_or_same(Key::from(key));
        if let Some(filter) = &*self.filters.insert(key) {
            self.metrics.keys(filter.keys(), filter.skipped());
        }
    }

    /// Inserts committed keys (a change feed's) into the filter in use and
    /// every filter being built.
    pub(crate) fn insert_batch(&self, batch: &KeyBatch) {
        let batch = &*self.config.key_type.canonical_batch(batch);
        if let Some(filter) = &*self.filters.insert_batch(batch) {
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
        self.overfull.store(false, Ordering::Release);
        *lock(&self.last_error) = None;
        *lock(&self.last_build) = Some((tokio::time::Instant::now(), origin));
        self.suspect.store(false, Ordering::Release);
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.generations.send_replace(generation);
        self.metrics
            .built(&figures(filter, estimated_fpp), generation);
        self.metrics.state(self.state());
        self.check_ready();
        Ok(generation)
    }

    pub(crate) fn record_failure(&self, error: String) {
        *lock(&self.last_error) = Some(error);
        self.metrics.state(self.state());
    }

    pub(crate) fn record_feed(&self, status: FeedStatus) {
        let mut feed = lock(&self.feed);
        // A follower that starts again counts from 0.
        let before = feed.as_ref().map_or(0, |(last, _)| last.changes);
        let new = status.changes.checked_sub(before).unwrap_or(status.changes);
        self.metrics.feed_read(new);
        *feed = Some((status, tokio::time::Instant::now()));
    }

    /// Where the guard is in its life (cheap: no look at the filter's bits).
    /// Until it has protected once, it is warming (degraded while no filter
    /// could be built).
    pub(crate) fn state(&self) -> GuardState {
        match self.state_now() {
            GuardState::Ready if self.overfull.load(Ordering::Acquire) => GuardState::Degraded,
            // A filter in use that does not protect yet: still warming.
            GuardState::Degraded if !self.is_ready() && self.has_filter() => GuardState::Warming,
            state => state,
        }
    }

    /// Whether a filter is in use that holds every key, as far as the
    /// guard knows without reading its bits.
    fn state_now(&self) -> GuardState {
        // Without a filter, a recorded failure means the first build failed;
        // with one, only a hold makes the guard let everything through.
        if !self.has_filter() {
            if lock(&self.last_error).is_some() {
                return GuardState::Degraded;
            }
            return GuardState::Warming;
        }
        if self.held_open.load(Ordering::Acquire) > 0 || self.suspect() {
            return GuardState::Degraded;
        }
        GuardState::Ready
    }

    /// Why the guard lets every request through, or answers less well than
    /// it should; `None` when it protects.
    fn reason(&self) -> Option<String> {
        if !self.has_filter() {
            return Some(match lock(&self.last_error).clone() {
                Some(error) => format!("the first filter cannot be built: {error}"),
                None => "building the first filter".to_owned(),
            });
        }
        if self.suspect() {
            return Some(
                "a false negative was seen: failing open until the next rebuild".to_owned(),
            );
        }
        if self.held_open.load(Ordering::Acquire) > 0 {
            return Some(self.hold_reason().unwrap_or_else(|| {
                "held open: the filter may lack keys until the change feed is read".to_owned()
            }));
        }
        if self.overfull.load(Ordering::Acquire) {
            return Some("the filter passed its false-positive bound: a rebuild is due".to_owned());
        }
        None
    }

    pub(crate) fn last_build(&self) -> Option<tokio::time::Instant> {
        lock(&self.last_build).map(|(at, _)| at)
    }

    /// The filter in use, unless the guard lets every request through (a
    /// hold, a suspected false negative): only then does it hold every key.
    pub(crate) fn complete_filter(&self) -> Option<Arc<Filter>> {
        if self.state() != GuardState::Ready {
            return None;
        }
        self.filters.current().as_ref().map(Arc::clone)
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
        let fill = filter.map_or(0.0, Filter::fill);
        let hashes = filter.map_or(0, Filter::hashes);
        let estimated_fpp = filter.map_or(0.0, Filter::estimated_fpp);
        let rejected = self.rejected.get();
        let false_positives = self.false_positives.get();
        let absent = rejected + false_positives;
        let last_error = lock(&self.last_error)
            .clone()
            .or_else(|| self.hold_reason());
        let last_build = *lock(&self.last_build);
        let state = self.state();
        let (mode_set_by, audit_rate_set_by) = self.settings.set_by();
        Stats {
            state,
            reason: self.reason(),
            generation: self.generation.load(Ordering::Acquire),
            keys: filter.map_or(0, Filter::keys),
            capacity: filter.map_or(0, Filter::capacity),
            bits: filter.map_or(0, Filter::bits),
            hashes,
            fill,
            target_fpp: self.config.target_fpp,
            estimated_fpp,
            sub_filters: filter.map_or(0, |filter| filter.stage_count() as u32),
            observed_fpp: if absent == 0 {
                0.0
            } else {
                false_positives as f64 / absent as f64
            },
            passed: self.passed.get(),
            rejected,
            false_positives,
            bad_keys: self.bad_keys.get(),
            unchecked: UncheckedCounts {
                too_long: self.unchecked[0].get(),
                not_utf8: self.unchecked[1].get(),
                ambiguous: self.unchecked[2].get(),
                not_of_key_type: self.unchecked[3].get(),
                uncomparable: self.unchecked[4].get(),
            },
            unguarded: self.unguarded.get(),
            mode: self.mode(),
            mode_set_by,
            audit_rate: self.settings.audit_rate(),
            audit_rate_set_by,
            shadow_would_reject: self.shadow_would_reject.get(),
            audited: self.audited.get(),
            shadow_false_negatives: self.false_negatives.get(),
            skipped_keys: filter.map_or(0, Filter::skipped),
            last_error,
            origin: last_build.map(|(_, origin)| origin),
            age_ms: last_build.map(|(at, _)| at.elapsed().as_millis() as u64),
            feed: lock(&self.feed).as_ref().map(|(status, at)| {
                let mut status = status.clone();
                status.read_ago_ms = at.elapsed().as_millis() as u64;
                status
            }),
        }
    }
}
