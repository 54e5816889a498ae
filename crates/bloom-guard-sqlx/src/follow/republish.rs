//! Publishing the filter in use again while the newest snapshot goes
//! stale: only once it lacks enough of the filter's changes, so an
//! unchanged filter costs the database no snapshot writes.

use tokio::time::Instant;

use super::fleet::publish;
use super::{Clock, Database, Engine, SnapshotStore, Stores};

impl<B: Database> Engine<B> {
    /// Republishes the filter in use when the newest snapshot is older than
    /// the interval and the filter changed enough since (or the snapshot
    /// is half the retention old), on one instance.
    pub(super) async fn republish_if_stale(&self) {
        // The changes read by the position published, counted before the
        // position is taken: a read that lands between the two is then
        // counted as lacking (published again), never as published.
        let read_then = self.changes_read();
        let (fingerprint, at) = {
            let fleet = self.fleet();
            match (&fleet.fingerprint, &fleet.position, fleet.scanned_at) {
                (Some(fingerprint), Some(position), Some(at)) => (
                    fingerprint.clone(),
                    Clock {
                        position: position.clone(),
                        at,
                    },
                ),
                _ => return,
            }
        };
        if self
            .fleet()
            .fresh_until
            .as_ref()
            .is_some_and(|(seen, until)| *seen == fingerprint && Instant::now() < *until)
        {
            return;
        }
        let fresh = || async {
            match self
                .backend
                .stores()
                .snapshots()
                .newest(self.guard.name(), &fingerprint)
                .await
            {
                Ok(Some(stored))
                    if stored.age_secs < self.schedule.snapshot_interval.as_secs_f64() =>
                {
                    let left = self.schedule.snapshot_interval.as_secs_f64() - stored.age_secs;
                    // The changes it lacks are still counted from this
                    // instance's last publish: its position may predate
                    // changes read since (a publish racing a read, or
                    // another instance's).
                    self.fleet().fresh_until = Some((
                        fingerprint.clone(),
                        Instant::now() + std::time::Duration::from_secs_f64(left.max(0.0)),
                    ));
                    true
                }
                Ok(Some(stored)) if !self.changed_enough(stored.age_secs) => {
                    // Unchanged: the same bytes again would cost the
                    // database a snapshot's writes for nothing. Looked at
                    // again an interval later.
                    self.fleet().fresh_until = Some((
                        fingerprint.clone(),
                        Instant::now() + self.schedule.snapshot_interval,
                    ));
                    true
                }
                Ok(_) => false,
                // Unknown: do not publish.
                Err(_) => true,
            }
        };
        if fresh().await {
            return;
        }
        // Under the lock, again: another instance (or this one's first
        // filter) may have published meanwhile.
        if let Ok(Some(build_lock)) = self.backend.stores().try_lock(self.guard.name()).await {
            if !fresh().await {
                publish(&self.backend, &self.guard, &fingerprint, &at).await;
                self.fleet().changes_at_fresh = read_then;
            }
            drop(build_lock);
        }
    }

    /// Changes this follower read since it started.
    fn changes_read(&self) -> u64 {
        self.guard.stats().feed.map_or(0, |feed| feed.changes)
    }

    /// Whether a snapshot `age_secs` old lacks enough of the filter's
    /// changes to be published again: [`REPUBLISH_SHARE`] of its keys (at
    /// least [`REPUBLISH_AT_LEAST`]) read since this instance last
    /// published (or started), or
    /// half the retention gone (a snapshot older than the feed's pruned
    /// horizon cannot be caught up).
    /// A zero interval republishes at every check, changed or not.
    fn changed_enough(&self, age_secs: f64) -> bool {
        if self.schedule.snapshot_interval.is_zero()
            || age_secs >= self.schedule.retention.as_secs_f64() / 2.0
        {
            return true;
        }
        let since = self.fleet().changes_at_fresh;
        let changed = self.changes_read().saturating_sub(since);
        let keys = self.guard.stats().keys;
        changed >= REPUBLISH_AT_LEAST.max((keys as f64 * REPUBLISH_SHARE) as u64)
    }
}

/// The share of a filter's keys in changes that makes a stale snapshot
/// worth publishing again.
const REPUBLISH_SHARE: f64 = 0.01;

/// The fewest changes that make a stale snapshot worth publishing again.
const REPUBLISH_AT_LEAST: u64 = 1_000;
