//! What happened to a guard's requests: one tally per outcome, read by
//! [`Stats`](crate::Stats) and recorded through the `metrics` facade at
//! once.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::keys::key::KeyError;
use crate::report::counter::Counter;
use crate::report::metrics::{self, request_counter, UNCHECKED_REASONS};
use crate::report::stats::UncheckedCounts;

/// False negatives logged with their key; the rest are only counted.
const LOGGED_FALSE_NEGATIVES: u64 = 10;

/// One outcome's count, kept here for the stats and in the recorder.
#[derive(Debug)]
struct Tally {
    count: Counter,
    metric: metrics::Counter,
}

impl Tally {
    fn new(name: &'static str, guard: &'static str) -> Self {
        Self::labelled(name, guard, &[])
    }

    fn labelled(
        name: &'static str,
        guard: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Self {
        Self {
            count: Counter::default(),
            metric: request_counter(name, guard, labels),
        }
    }

    #[inline]
    fn increment(&self) {
        self.count.increment();
        self.metric.increment(1);
    }

    fn get(&self) -> u64 {
        self.count.get()
    }
}

/// The tallies of a guard's requests.
#[derive(Debug)]
pub(crate) struct Counters {
    guard: &'static str,
    passed: Tally,
    rejected: Tally,
    false_positives: Tally,
    bad_keys: Tally,
    /// By [`unchecked_index`].
    unchecked: [Tally; UNCHECKED_REASONS.len()],
    unguarded: Tally,
    shadow_would_reject: Tally,
    audited: Tally,
    false_negatives: Tally,
    barrier_waits: Tally,
    barrier_found: Tally,
    barrier_timeouts: Tally,
    /// Whether the first unguarded request was logged.
    warned_unguarded: AtomicBool,
}

/// The counts at one moment, for [`Stats`](crate::Stats).
#[derive(Debug, Clone)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) rejected: u64,
    pub(crate) false_positives: u64,
    pub(crate) bad_keys: u64,
    pub(crate) unchecked: UncheckedCounts,
    pub(crate) unguarded: u64,
    pub(crate) shadow_would_reject: u64,
    pub(crate) audited: u64,
    pub(crate) false_negatives: u64,
    pub(crate) barrier_waits: u64,
    pub(crate) barrier_found: u64,
    pub(crate) barrier_timeouts: u64,
}

impl Counts {
    /// The share of the keys found absent that the filter let through.
    pub(crate) fn observed_fpp(&self) -> f64 {
        let absent = self.rejected + self.false_positives;
        if absent == 0 {
            0.0
        } else {
            self.false_positives as f64 / absent as f64
        }
    }
}

/// The slot of an unchecked reason in the tallies and in
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

impl Counters {
    pub(crate) fn new(guard: &'static str) -> Self {
        Self {
            guard,
            passed: Tally::new("bloom_guard_passed_total", guard),
            rejected: Tally::new("bloom_guard_rejected_total", guard),
            false_positives: Tally::new("bloom_guard_false_positives_total", guard),
            bad_keys: Tally::new("bloom_guard_bad_keys_total", guard),
            unchecked: UNCHECKED_REASONS.map(|reason| {
                Tally::labelled("bloom_guard_unchecked_total", guard, &[("reason", reason)])
            }),
            unguarded: Tally::new("bloom_guard_unguarded_total", guard),
            shadow_would_reject: Tally::new("bloom_guard_shadow_would_reject_total", guard),
            audited: Tally::new("bloom_guard_audited_total", guard),
            false_negatives: Tally::new("bloom_guard_false_negatives_total", guard),
            barrier_waits: Tally::new("bloom_guard_barrier_waits_total", guard),
            barrier_found: Tally::new("bloom_guard_barrier_found_total", guard),
            barrier_timeouts: Tally::new("bloom_guard_barrier_timeouts_total", guard),
            warned_unguarded: AtomicBool::new(false),
        }
    }

    #[inline]
    pub(crate) fn passed(&self) {
        self.passed.increment();
    }

    #[inline]
    pub(crate) fn rejected(&self) {
        self.rejected.increment();
    }

    pub(crate) fn false_positive(&self) {
        self.false_positives.increment();
    }

    pub(crate) fn bad_key(&self) {
        self.bad_keys.increment();
    }

    /// A request passed on without a lookup, by why.
    pub(crate) fn unchecked(&self, why: &KeyError) {
        match (unchecked_index(why), why) {
            (Some(index), _) => self.unchecked[index].increment(),
            (None, KeyError::Unguardable(why)) => self.unguarded(why),
            (None, _) => {}
        }
    }

    /// A request the layer could not check; the first is logged.
    pub(crate) fn unguarded(&self, why: &'static str) {
        self.unguarded.increment();
        if !self.warned_unguarded.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                guard = self.guard,
                why,
                "a guarded route passes requests unchecked; see Stats::unguarded"
            );
        }
    }

    pub(crate) fn shadow_would_reject(&self) {
        self.shadow_would_reject.increment();
    }

    pub(crate) fn audited(&self) {
        self.audited.increment();
    }

    /// A would-be refusal waited for the read barrier; the read brought
    /// its key (`found`), or none finished in time (`timed_out`).
    pub(crate) fn barrier_wait(&self, found: bool, timed_out: bool) {
        self.barrier_waits.increment();
        if found {
            self.barrier_found.increment();
        }
        if timed_out {
            self.barrier_timeouts.increment();
        }
    }

    /// The inner service found a key the filter said was absent; the first
    /// few are logged with their key (never the rest of the request).
    pub(crate) fn false_negative(&self, key: &[u8]) {
        let seen = self.false_negatives.get();
        self.false_negatives.increment();
        if seen < LOGGED_FALSE_NEGATIVES {
            tracing::error!(
                guard = self.guard,
                key = %String::from_utf8_lossy(key),
                "false negative: the filter said absent, the service found the key"
            );
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        let unchecked = |index: usize| self.unchecked[index].get();
        Counts {
            passed: self.passed.get(),
            rejected: self.rejected.get(),
            false_positives: self.false_positives.get(),
            bad_keys: self.bad_keys.get(),
            unchecked: UncheckedCounts {
                too_long: unchecked(0),
                not_utf8: unchecked(1),
                ambiguous: unchecked(2),
                not_of_key_type: unchecked(3),
                uncomparable: unchecked(4),
            },
            unguarded: self.unguarded.get(),
            shadow_would_reject: self.shadow_would_reject.get(),
            audited: self.audited.get(),
            false_negatives: self.false_negatives.get(),
            barrier_waits: self.barrier_waits.get(),
            barrier_found: self.barrier_found.get(),
            barrier_timeouts: self.barrier_timeouts.get(),
        }
    }
}
