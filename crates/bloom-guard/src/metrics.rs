//! The guard's figures through the `metrics` facade (feature `metrics`).

use std::time::Duration;

use crate::shared::Shared;

/// Records a finished build: its duration, and whether it failed.
#[cfg(feature = "metrics")]
pub(crate) fn record_build(shared: &Shared, elapsed: Duration, ok: bool) {
    let guard = shared.config.name;
    if ok {
        metrics::histogram!("bloom_guard_rebuild_duration_seconds", "guard" => guard)
            .record(elapsed.as_secs_f64());
    } else {
        metrics::counter!("bloom_guard_rebuild_failures_total", "guard" => guard).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn record_build(_: &Shared, _: Duration, _: bool) {}

#[cfg(feature = "metrics")]
impl crate::BloomGuard {
    /// Publishes the guard's counters and gauges to the installed `metrics`
    /// recorder. Call it when metrics are scraped: the request path keeps
    /// its own atomic counters and never calls the recorder.
    ///
    /// Counters: `bloom_guard_passed_total`, `bloom_guard_rejected_total`,
    /// `bloom_guard_false_positives_total`, `bloom_guard_bad_keys_total`,
    /// `bloom_guard_unguarded_total`, `bloom_guard_shadow_would_reject_total`,
    /// `bloom_guard_audited_total`, `bloom_guard_false_negatives_total`;
    /// gauges `bloom_guard_skipped_keys` and `bloom_guard_mode` (1 for the
    /// mode in force, label `mode`).
    /// Gauges: `bloom_guard_keys`, `bloom_guard_bits`, `bloom_guard_fill_ratio`,
    /// `bloom_guard_estimated_fpp`, `bloom_guard_observed_fpp`,
    /// `bloom_guard_target_fpp`, `bloom_guard_generation`, `bloom_guard_ready`.
    /// Builds also record `bloom_guard_rebuild_duration_seconds` and
    /// `bloom_guard_rebuild_failures_total`. Every series has the label
    /// `guard` (see [`Builder::name`](crate::Builder::name)).
    pub fn publish_metrics(&self) {
        let stats = self.stats();
        let guard = self.shared.config.name;
        metrics::counter!("bloom_guard_passed_total", "guard" => guard).absolute(stats.passed);
        metrics::counter!("bloom_guard_rejected_total", "guard" => guard).absolute(stats.rejected);
        metrics::counter!("bloom_guard_false_positives_total", "guard" => guard)
            .absolute(stats.false_positives);
        metrics::counter!("bloom_guard_bad_keys_total", "guard" => guard).absolute(stats.bad_keys);
        metrics::counter!("bloom_guard_unguarded_total", "guard" => guard)
            .absolute(stats.unguarded);
        metrics::gauge!("bloom_guard_skipped_keys", "guard" => guard)
            .set(stats.skipped_keys as f64);
        metrics::gauge!("bloom_guard_keys", "guard" => guard).set(stats.keys as f64);
        metrics::gauge!("bloom_guard_bits", "guard" => guard).set(stats.bits as f64);
        metrics::gauge!("bloom_guard_fill_ratio", "guard" => guard).set(stats.fill);
        metrics::gauge!("bloom_guard_estimated_fpp", "guard" => guard).set(stats.estimated_fpp);
        metrics::gauge!("bloom_guard_observed_fpp", "guard" => guard).set(stats.observed_fpp);
        metrics::gauge!("bloom_guard_target_fpp", "guard" => guard).set(stats.target_fpp);
        metrics::gauge!("bloom_guard_generation", "guard" => guard).set(stats.generation as f64);
        let ready = stats.state == crate::GuardState::Ready;
        metrics::gauge!("bloom_guard_ready", "guard" => guard).set(if ready { 1.0 } else { 0.0 });
    }
}
