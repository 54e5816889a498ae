//! The guard's figures through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), recorded where they happen: any recorder
//! installed in the application (Prometheus, StatsD, OpenTelemetry, ...)
//! sees them. Without the feature every handle is a no-op.
//!
//! The handles are registered when the guard is built, so install the
//! recorder before building guards.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::report::stats::GuardState;
use crate::switches::mode::Mode;

#[cfg(feature = "metrics")]
pub(crate) use ::metrics::{Counter, Gauge};

#[cfg(not(feature = "metrics"))]
pub(crate) use noop::{Counter, Gauge};

#[cfg(feature = "metrics")]
mod describe;
#[cfg(feature = "metrics")]
pub use describe::{describe_metrics, DURATION_BUCKETS};

/// The `reason` labels of `bloom_guard_unchecked_total`, in the order of
/// [`Counters`](crate::report::counters::Counters)' unchecked tallies: the [`reason`](crate::keys::KeyError::reason)s.
pub(crate) const UNCHECKED_REASONS: [&str; 5] = [
    "too_long",
    "not_utf8",
    "ambiguous",
    "not_of_key_type",
    "uncomparable",
];

/// The mode in force of `guard`: 1 for it, 0 for the others.
pub(crate) fn mode_in_force(guard: &'static str, in_force: Mode) {
    #[cfg(feature = "metrics")]
    for mode in [Mode::Enforce, Mode::Shadow, Mode::Off] {
        let value = if mode == in_force { 1.0 } else { 0.0 };
        ::metrics::gauge!("bloom_guard_mode", "guard" => guard, "mode" => mode.as_str()).set(value);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (guard, in_force);
}

/// A request counter's handle, labelled with its guard (and `labels`).
pub(crate) fn request_counter(
    name: &'static str,
    guard: &'static str,
    labels: &[(&'static str, &'static str)],
) -> Counter {
    #[cfg(feature = "metrics")]
    {
        let mut all = vec![("guard", guard)];
        all.extend_from_slice(labels);
        ::metrics::counter!(name, &all)
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = (name, guard, labels);
        Counter
    }
}

/// Unix time in seconds, for the timestamp gauges.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One guard's metric handles, registered once so the request path only
/// bumps them.
#[derive(Debug)]
pub(crate) struct GuardMetrics {
    build_failures: Counter,
    feed_changes: Counter,
    feed_reads: Counter,
    feed_shared_reads: Counter,
    feed_read_at: Gauge,
    feed_bytes: Gauge,
    feed_prune_overdue: Gauge,
    feed_lag: Gauge,
    built_at: Gauge,
    keys: Gauge,
    capacity: Gauge,
    skipped_keys: Gauge,
    bits: Gauge,
    hashes: Gauge,
    sub_filters: Gauge,
    estimated_fpp: Gauge,
    generation: Gauge,
    ready: Gauge,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    guard: &'static str,
}

/// What a filter put in place reports.
pub(crate) struct FilterFigures {
    pub(crate) keys: u64,
    pub(crate) capacity: u64,
    pub(crate) skipped: u64,
    pub(crate) bits: u64,
    pub(crate) hashes: u32,
    pub(crate) sub_filters: usize,
    pub(crate) estimated_fpp: f64,
}

impl GuardMetrics {
    #[cfg(feature = "metrics")]
    pub(crate) fn new(guard: &'static str, target_fpp: f64, mode: Mode) -> Self {
        use ::metrics::{counter, gauge};
        describe_metrics();
        let metrics = Self {
            build_failures: counter!("bloom_guard_build_failures_total", "guard" => guard),
            feed_changes: counter!("bloom_guard_feed_changes_total", "guard" => guard),
            feed_reads: counter!("bloom_guard_feed_reads_total", "guard" => guard),
            feed_shared_reads: counter!("bloom_guard_feed_shared_reads_total", "guard" => guard),
            feed_read_at: gauge!("bloom_guard_feed_read_timestamp_seconds", "guard" => guard),
            feed_bytes: gauge!("bloom_guard_feed_bytes", "guard" => guard),
            feed_prune_overdue: gauge!("bloom_guard_feed_prune_overdue_seconds", "guard" => guard),
            feed_lag: gauge!("bloom_guard_feed_lag_seconds", "guard" => guard),
            built_at: gauge!("bloom_guard_built_timestamp_seconds", "guard" => guard),
            keys: gauge!("bloom_guard_keys", "guard" => guard),
            capacity: gauge!("bloom_guard_capacity", "guard" => guard),
            skipped_keys: gauge!("bloom_guard_skipped_keys", "guard" => guard),
            bits: gauge!("bloom_guard_bits", "guard" => guard),
            hashes: gauge!("bloom_guard_hashes", "guard" => guard),
            sub_filters: gauge!("bloom_guard_sub_filters", "guard" => guard),
            estimated_fpp: gauge!("bloom_guard_estimated_fpp", "guard" => guard),
            generation: gauge!("bloom_guard_generation", "guard" => guard),
            ready: gauge!("bloom_guard_ready", "guard" => guard),
            guard,
        };
        gauge!("bloom_guard_target_fpp", "guard" => guard).set(target_fpp);
        metrics.ready.set(0.0);
        mode_in_force(guard, mode);
        metrics
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) fn new(guard: &'static str, _: f64, _: Mode) -> Self {
        Self {
            build_failures: Counter,
            feed_changes: Counter,
            feed_reads: Counter,
            feed_shared_reads: Counter,
            feed_read_at: Gauge,
            feed_bytes: Gauge,
            feed_prune_overdue: Gauge,
            feed_lag: Gauge,
            built_at: Gauge,
            keys: Gauge,
            capacity: Gauge,
            skipped_keys: Gauge,
            bits: Gauge,
            hashes: Gauge,
            sub_filters: Gauge,
            estimated_fpp: Gauge,
            generation: Gauge,
            ready: Gauge,
            guard,
        }
    }

    pub(crate) fn state(&self, state: GuardState) {
        self.ready
            .set(if state == GuardState::Ready { 1.0 } else { 0.0 });
    }

    pub(crate) fn keys(&self, keys: u64, skipped: u64) {
        self.keys.set(keys as f64);
        self.skipped_keys.set(skipped as f64);
    }

    /// A filter put in place as `generation`.
    pub(crate) fn built(&self, filter: &FilterFigures, generation: u64) {
        self.filter(filter);
        self.generation.set(generation as f64);
        self.built_at.set(unix_now());
    }

    /// The filter in use as it is now.
    pub(crate) fn filter(&self, filter: &FilterFigures) {
        self.keys(filter.keys, filter.skipped);
        self.capacity.set(filter.capacity as f64);
        self.bits.set(filter.bits as f64);
        self.hashes.set(f64::from(filter.hashes));
        self.sub_filters.set(filter.sub_filters as f64);
        self.estimated_fpp.set(filter.estimated_fpp);
    }

    /// A finished build from `source` (`scan` or `snapshot`).
    pub(crate) fn build_finished(&self, source: &'static str, elapsed: Duration, ok: bool) {
        if ok {
            #[cfg(feature = "metrics")]
            {
                let labels = [("guard", self.guard), ("source", source)];
                ::metrics::counter!("bloom_guard_builds_total", &labels).increment(1);
                ::metrics::histogram!("bloom_guard_build_duration_seconds", &labels)
                    .record(elapsed.as_secs_f64());
            }
            #[cfg(not(feature = "metrics"))]
            let _ = (source, elapsed);
        } else {
            self.build_failures.increment(1);
        }
    }

    /// Successful feed reads since the last recorded: the changes they
    /// brought, how many, and how many shared a statement with another
    /// guard's.
    pub(crate) fn feed_read(&self, [changes, reads, shared]: [u64; 3], lag_ms: Option<u64>) {
        if let Some(lag) = lag_ms {
            self.feed_lag.set(lag as f64 / 1000.0);
        }
        self.feed_changes.increment(changes);
        self.feed_reads.increment(reads);
        self.feed_shared_reads.increment(shared);
        self.feed_read_at.set(unix_now());
    }

    /// The feed's room in the database and its pruning.
    pub(crate) fn feed_storage(&self, storage: &crate::report::stats::FeedStorage) {
        self.feed_bytes.set(storage.bytes as f64);
        self.feed_prune_overdue
            .set(storage.prune_overdue_secs as f64);
    }
}

/// Stand-ins for the `metrics` handles when the feature is off.
#[cfg(not(feature = "metrics"))]
mod noop {
    #[derive(Debug, Clone)]
    pub(crate) struct Counter;

    impl Counter {
        #[inline]
        pub(crate) fn increment(&self, _: u64) {}
    }

    #[derive(Debug, Clone)]
    pub(crate) struct Gauge;

    impl Gauge {
        #[inline]
        pub(crate) fn set(&self, _: f64) {}
    }
}
