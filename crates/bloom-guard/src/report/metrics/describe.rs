//! Describing the guard's metrics to the installed recorder, and the
//! bucket bounds of its histograms.

/// Bucket bounds in seconds for the guard's duration histograms, from a
/// millisecond (a snapshot of a small filter) to five minutes (a scan of
/// hundreds of millions of keys). For recorders that need them, such as
/// `metrics-exporter-prometheus`:
///
/// ```
/// # #[cfg(any())] {
/// PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("bloom_guard_".into()), bloom_guard::metrics::DURATION_BUCKETS)?
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
/// | `bloom_guard_barrier_waits_total` | counter | requests |
/// | `bloom_guard_barrier_found_total` | counter | requests |
/// | `bloom_guard_barrier_timeouts_total` | counter | requests |
/// | `bloom_guard_builds_total` (label `source`) | counter | builds |
/// | `bloom_guard_build_failures_total` | counter | builds |
/// | `bloom_guard_build_duration_seconds` (label `source`) | histogram | seconds |
/// | `bloom_guard_feed_changes_total` | counter | changes |
/// | `bloom_guard_feed_reads_total` | counter | reads |
/// | `bloom_guard_feed_shared_reads_total` | counter | reads |
/// | `bloom_guard_feed_read_timestamp_seconds` | gauge | seconds |
/// | `bloom_guard_feed_bytes` | gauge | bytes |
/// | `bloom_guard_feed_prune_overdue_seconds` | gauge | seconds |
/// | `bloom_guard_feed_lag_seconds` | gauge | seconds |
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
#[cfg_attr(feature = "admin", doc = include_str!("../../../docs/metrics.md"))]
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
        "Would-be rejections the service answered as found (2xx or 3xx unless the guard says otherwise): keys missing from the filter. Anything but 0 is a defect.",
    );
    requests(
        "bloom_guard_barrier_waits_total",
        "Would-be refusals that waited for a feed read begun after the request arrived.",
    );
    requests(
        "bloom_guard_barrier_found_total",
        "Would-be refusals whose key the barrier's feed read brought: answered by the handler.",
    );
    requests(
        "bloom_guard_barrier_timeouts_total",
        "Would-be refusals passed on because no feed read finished within the bound.",
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
    describe_counter!(
        "bloom_guard_feed_reads_total",
        Unit::Count,
        "Reads of the change feed (each a statement, or a share of one)."
    );
    describe_counter!(
        "bloom_guard_feed_shared_reads_total",
        Unit::Count,
        "Reads of the change feed made by one statement with another guard's, for refusals of both."
    );
    describe_gauge!(
        "bloom_guard_feed_read_timestamp_seconds",
        Unit::Seconds,
        "Unix time of the last successful feed read: every key committed before it is in the filter."
    );
    describe_gauge!(
        "bloom_guard_feed_bytes",
        Unit::Bytes,
        "The change feed's tables and indexes in the database (Postgres)."
    );
    describe_gauge!(
        "bloom_guard_feed_prune_overdue_seconds",
        Unit::Seconds,
        "How long the oldest retired part of the feed has been due for removal (Postgres): a long transaction, or nothing pruning."
    );
    describe_gauge!(
        "bloom_guard_feed_lag_seconds",
        Unit::Seconds,
        "Commit to feed, as of the last feed write before the last read (the Postgres log feed): the oldest commit of that write to the write."
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
