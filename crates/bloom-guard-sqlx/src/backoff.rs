//! The one backoff of the crate's retry loops.

use std::time::Duration;

/// The longest pause between two attempts of anything that fails.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Pauses from 100 ms doubling up to 10 s, jittered so a fleet restarting
/// together does not retry in step: every retry loop of the crate.
pub(crate) fn retry_pauses() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(MAX_PAUSE)
        .with_jitter()
        .without_max_times()
        .build()
}
