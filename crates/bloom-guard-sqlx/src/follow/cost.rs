//! What a start costs: replaying the feed into a snapshot, or scanning.
//!
//! Replaying a feed row costs more than scanning a key (each row is read
//! through its own visibility test, and a key may come more than once),
//! so a snapshot saves time only while the feed since it is short next to
//! the table. The follower measures both rates as it scans and replays,
//! and starts from rates measured by `bloom-load` (see
//! `docs/benchmarks.md`).

use std::time::Duration;

/// Keys per second a scan reads, before the follower measured one.
const SCAN_KEYS_PER_SEC: f64 = 1_500_000.0;
/// Feed rows per second a replay reads, before the follower measured one.
const REPLAY_ROWS_PER_SEC: f64 = 300_000.0;
/// A replay this short is always worth it: a scan costs a round of
/// queries and a fresh filter whatever the table's size.
const ALWAYS_REPLAY: u64 = 10_000;
/// Shorter runs say little about a rate.
const MIN_SAMPLE: u64 = 10_000;

/// The rates the follower measured last.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rates {
    scan: f64,
    replay: f64,
}

impl Default for Rates {
    fn default() -> Self {
        Self {
            scan: SCAN_KEYS_PER_SEC,
            replay: REPLAY_ROWS_PER_SEC,
        }
    }
}

impl Rates {
    /// A scan read `keys` in `took`.
    pub(super) fn scanned(&mut self, keys: u64, took: Duration) {
        if let Some(rate) = rate(keys, took) {
            self.scan = rate;
        }
    }

    /// A replay read `rows` in `took`.
    pub(super) fn replayed(&mut self, rows: u64, took: Duration) {
        if let Some(rate) = rate(rows, took) {
            self.replay = rate;
        }
    }

    /// The most feed rows worth replaying into a snapshot of `keys` keys:
    /// replaying `r` rows takes `r / replay`, a scan `(keys + r) / scan`.
    pub(super) fn replay_limit(&self, keys: u64) -> u64 {
        let ratio = self.replay / self.scan;
        let limit = if ratio >= 1.0 {
            u64::MAX
        } else {
            (keys as f64 * ratio / (1.0 - ratio)) as u64
        };
        limit.max(ALWAYS_REPLAY)
    }
}

fn rate(count: u64, took: Duration) -> Option<f64> {
    (count >= MIN_SAMPLE && !took.is_zero()).then(|| count as f64 / took.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_is_worth_it_while_the_feed_is_short_next_to_the_table() {
        let mut rates = Rates::default();
        rates.scanned(2_000_000, Duration::from_secs(1));
        rates.replayed(500_000, Duration::from_secs(1));
        // A quarter of the scan's rate: replaying r rows beats scanning
        // 5M + r keys while r < 5M / 3.
        assert_eq!(rates.replay_limit(5_000_000), 1_666_666);
        assert_eq!(rates.replay_limit(100), ALWAYS_REPLAY);
        // Too short a run to measure anything.
        rates.replayed(10, Duration::from_nanos(1));
        assert_eq!(rates.replay_limit(5_000_000), 1_666_666);
        rates.replayed(4_000_000, Duration::from_secs(1));
        assert_eq!(rates.replay_limit(5_000_000), u64::MAX);
    }
}
