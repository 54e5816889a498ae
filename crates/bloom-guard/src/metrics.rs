//! The guard's figures through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), recorded where they happen: any recorder
//! installed in the application (Prometheus, StatsD, OpenTelemetry, ...)
//! sees them. Without the feature every handle is a no-op.
//!
//! The handles are registered when the guard is built, so install the
//! recorder before building guards.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::mode::Mode;
use crate::stats::GuardState;

#[cfg(feature = "metrics")]
use ::metrics::{Counter, Gauge};

#[cfg(not(feature = "metrics"))]
use noop::{Counter, Gauge};

/// Bucket bounds in seconds for the guard's duration histograms, from a
/// millisecond (a snapshot of a small filter) to five minutes (a scan of
/// hundreds of millions of keys). For recorders that need them, such as
/// `metrics-exporter-prometheus`:
///
/// ```
/// # #[cfg(any())] {
/// PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("bloom_guard_".into()), bloom_guard::DURATION_BUCKETS)?
///     .install_recorder()?;
/// # }
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Describes every metric of the guard (help text and unit) to the
/// installed recorder. [`Builder::build`](crate::Builder::build) calls it;
/// call it yourself after installing a recorder later.
///
/// Every series carries the label `guard`, the guard's
/// [`name`](crate::Builder::name).
///
/// | metric | kind | unit |
/// |---|---|---|
/// | `bloom_guard_passed_total` | counter | requests |
/// | `bloom_guard_rejected_total` | counter | requests |
/// | `bloom_guard_false_positives_total` | counter | requests |
/// | `bloom_guard_bad_keys_total` | counter | requests |
/// | `bloom_guard_unchecked_total` (label `reason`) | counter | requests |
/// | `bloom_guard_unguarded_total` | counter | requests |
/// | `bloom_guard_shadow_would_reject_total` | counter | requests |
/// | `bloom_guard_audited_total` | counter | requests |
/// | `bloom_guard_false_negatives_total` | counter | requests |
/// | `bloom_guard_builds_total` (label `source`) | counter | builds |
/// | `bloom_guard_build_failures_total` | counter | builds |
/// | `bloom_guard_build_duration_seconds` (label `source`) | histogram | seconds |
/// | `bloom_guard_feed_changes_total` | counter | changes |
/// | `bloom_guard_feed_read_timestamp_seconds` | gauge | seconds |
/// | `bloom_guard_built_timestamp_seconds` | gauge | seconds |
/// | `bloom_guard_keys` | gauge | keys |
/// | `bloom_guard_capacity` | gauge | keys |
/// | `bloom_guard_skipped_keys` | gauge | keys |
/// | `bloom_guard_bits` | gauge | bits |
/// | `bloom_guard_hashes` | gauge | |
/// | `bloom_guard_sub_filters` | gauge | |
/// | `bloom_guard_estimated_fpp` | gauge | ratio |
/// | `bloom_guard_target_fpp` | gauge | ratio |
/// | `bloom_guard_generation` | gauge | |
/// | `bloom_guard_ready` | gauge | 1 or 0 |
/// | `bloom_guard_mode` (label `mode`) | gauge | 1 for the mode in force |
///
/// The filter figures (`keys` to `estimated_fpp`) are set when a filter is
/// put in place and at every check of [`BloomGuard::maintain`](crate::BloomGuard::maintain)
/// (or a follower's): a filter grows sub-filters as keys arrive.
///
#[cfg_attr(feature = "admin", doc = include_str!("../docs/metrics.md"))]
#[cfg_attr(
    not(feature = "admin"),
    doc = "The metrics page (wiring with the admin router, the reference, what to watch, the dashboard) shows on this item with feature `admin` too, as on docs.rs."
)]
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    let requests =
        |name: &'static str, help: &'static str| describe_counter!(name, Unit::Count, help);
    requests(
        "bloom_guard_passed_total",
        "Requests with a key the guard let through.",
    );
    requests(
        "bloom_guard_rejected_total",
        "Requests the guard answered itself: their key is absent.",
    );
    requests(
        "bloom_guard_false_positives_total",
        "Keys let through that the database did not hold (reported by the service).",
    );
    requests(
        "bloom_guard_bad_keys_total",
        "Requests refused with a 400 for a key longer than max_key_len (with refuse_long_keys).",
    );
    requests(
        "bloom_guard_unchecked_total",
        "Requests passed to the handler without a lookup: the key could not be put in canonical form with certainty (label reason).",
    );
    requests(
        "bloom_guard_unguarded_total",
        "Requests the layer could not check (a wiring mistake), passed on unchecked.",
    );
    requests(
        "bloom_guard_shadow_would_reject_total",
        "Requests shadow mode passed on that enforce mode would have answered as absent.",
    );
    requests(
        "bloom_guard_audited_total",
        "Would-be rejections passed on in enforce mode by the audit sample.",
    );
    requests(
        "bloom_guard_false_negatives_total",
        "Would-be rejections the service answered with a 2xx: keys missing from the filter. Anything but 0 is a defect.",
    );
    describe_counter!(
        "bloom_guard_builds_total",
        Unit::Count,
        "Filters put in place, by source (scan or snapshot)."
    );
    describe_counter!(
        "bloom_guard_build_failures_total",
        Unit::Count,
        "Filter builds that failed; the filter in use stayed."
    );
    describe_histogram!(
        "bloom_guard_build_duration_seconds",
        Unit::Seconds,
        "Time to put a filter in place, by source (scan or snapshot)."
    );
    describe_counter!(
        "bloom_guard_feed_changes_total",
        Unit::Count,
        "Changes read from the change feed."
    );
    describe_gauge!(
        "bloom_guard_feed_read_timestamp_seconds",
        Unit::Seconds,
        "Unix time of the last successful feed read: every key committed before it is in the filter."
    );
    describe_gauge!(
        "bloom_guard_built_timestamp_seconds",
        Unit::Seconds,
        "Unix time the filter in use was put in place."
    );
    describe_gauge!(
        "bloom_guard_keys",
        Unit::Count,
        "Keys in the filter in use."
    );
    describe_gauge!(
        "bloom_guard_capacity",
        Unit::Count,
        "Keys the filter in use was sized for."
    );
    describe_gauge!(
        "bloom_guard_skipped_keys",
        Unit::Count,
        "Stored keys no request can name, left out of the filter."
    );
    describe_gauge!(
        "bloom_guard_bits",
        Unit::Count,
        "Size of the filter in use in bits."
    );
    describe_gauge!(
        "bloom_guard_hashes",
        Unit::Count,
        "Hash functions per key of the filter in use."
    );
    describe_gauge!(
        "bloom_guard_sub_filters",
        Unit::Count,
        "Sub-filters the filter in use has grown into."
    );
    describe_gauge!(
        "bloom_guard_estimated_fpp",
        "The false-positive rate of the filter in use, estimated from its fill."
    );
    describe_gauge!(
        "bloom_guard_target_fpp",
        "The false-positive rate the filter is sized for."
    );
    describe_gauge!(
        "bloom_guard_generation",
        Unit::Count,
        "Filters put in place since start."
    );
    describe_gauge!(
        "bloom_guard_ready",
        "1 while the guard answers absent keys, 0 while it lets every request through."
    );
    describe_gauge!(
        "bloom_guard_mode",
        "1 for the mode in force (enforce, shadow, off), 0 for the others."
    );
}

/// The `reason` labels of `bloom_guard_unchecked_total`, in the order of
/// [`GuardMetrics::unchecked`]: the [`reason`](crate::KeyError::reason)s.
pub(crate) const UNCHECKED_REASONS: [&str; 5] = [
    "too_long",
    "not_utf8",
    "ambiguous",
    "not_of_key_type",
    "uncomparable",
];

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
    pub(crate) passed: Counter,
    pub(crate) rejected: Counter,
    pub(crate) false_positives: Counter,
    pub(crate) bad_keys: Counter,
    pub(crate) unchecked: [Counter; UNCHECKED_REASONS.len()],
    pub(crate) unguarded: Counter,
    pub(crate) shadow_would_reject: Counter,
    pub(crate) audited: Counter,
    pub(crate) false_negatives: Counter,
    build_failures: Counter,
    feed_changes: Counter,
    feed_read_at: Gauge,
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
            passed: counter!("bloom_guard_passed_total", "guard" => guard),
            rejected: counter!("bloom_guard_rejected_total", "guard" => guard),
            false_positives: counter!("bloom_guard_false_positives_total", "guard" => guard),
            bad_keys: counter!("bloom_guard_bad_keys_total", "guard" => guard),
            unchecked: UNCHECKED_REASONS.map(
                |reason| counter!("bloom_guard_unchecked_total", "guard" => guard, "reason" => reason),
            ),
            unguarded: counter!("bloom_guard_unguarded_total", "guard" => guard),
            shadow_would_reject: counter!("bloom_guard_shadow_would_reject_total", "guard" => guard),
            audited: counter!("bloom_guard_audited_total", "guard" => guard),
            false_negatives: counter!("bloom_guard_false_negatives_total", "guard" => guard),
            build_failures: counter!("bloom_guard_build_failures_total", "guard" => guard),
            feed_changes: counter!("bloom_guard_feed_changes_total", "guard" => guard),
            feed_read_at: gauge!("bloom_guard_feed_read_timestamp_seconds", "guard" => guard),
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
        metrics.mode(mode);
        metrics
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) fn new(guard: &'static str, _: f64, _: Mode) -> Self {
        Self {
            passed: Counter,
            rejected: Counter,
            false_positives: Counter,
            bad_keys: Counter,
            unchecked: [Counter, Counter, Counter, Counter, Counter],
            unguarded: Counter,
            shadow_would_reject: Counter,
            audited: Counter,
            false_negatives: Counter,
            build_failures: Counter,
            feed_changes: Counter,
            feed_read_at: Gauge,
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

    /// The mode in force: 1 for it, 0 for the others.
    pub(crate) fn mode(&self, in_force: Mode) {
        #[cfg(feature = "metrics")]
        for mode in [Mode::Enforce, Mode::Shadow, Mode::Off] {
            let value = if mode == in_force { 1.0 } else { 0.0 };
            ::metrics::gauge!("bloom_guard_mode", "guard" => self.guard, "mode" => mode.as_str())
                .set(value);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = in_force;
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

    /// A successful feed read that brought `changes` changes.
    pub(crate) fn feed_read(&self, changes: u64) {
        self.feed_changes.increment(changes);
        self.feed_read_at.set(unix_now());
    }
}

/// Stand-ins for the `metrics` handles when the feature is off.
#[cfg(not(feature = "metrics"))]
mod noop {
    #[derive(Debug)]
    pub(crate) struct Counter;

    impl Counter {
        #[inline]
        pub(crate) fn increment(&self, _: u64) {}
    }

    #[derive(Debug)]
    pub(crate) struct Gauge;

    impl Gauge {
        #[inline]
        pub(crate) fn set(&self, _: f64) {}
    }
}
