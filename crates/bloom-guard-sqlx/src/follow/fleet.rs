//! One scan per fleet: the first filter, adopting and publishing
//! snapshots, and rebuilds run once for every instance.

use std::collections::HashSet;
use std::fmt;

use bloom_guard::BloomGuard;
use tokio::time::Instant;

use super::catch_up::{Candidate, CatchUpError};
use super::cost::Rates;
use super::prefetch::Loaded;
use super::{Clock, Database, Engine, LoadError, SnapshotStore, Stored, Stores};

/// What the follower knows of the fleet's snapshots.
#[derive(Debug)]
pub(super) struct Fleet<P> {
    /// The key source's fingerprint, once known.
    pub(super) fingerprint: Option<String>,
    /// The feed position of the last read: every key committed before it
    /// is in the filter.
    pub(super) position: Option<P>,
    /// When the scan that the filter in use descends from started (µs,
    /// the database's clock).
    pub(super) scanned_at: Option<i64>,
    /// Snapshots refused once, never tried again.
    pub(super) refused: HashSet<i64>,
    /// The feed triggers' versions at the last check.
    pub(super) trigger_versions: Option<String>,
    /// Scan and replay rates, measured as they run.
    pub(super) rates: Rates,
    /// Keys a first scan should be sized for, when a snapshot said more
    /// than the source's count hint can (its keys plus the feed since it).
    pub(super) expected_keys: u64,
    /// Until when the newest stored snapshot is known to be fresh (its age
    /// at the last look, counted on): no look before then, since a snapshot
    /// published meanwhile only makes the newest one younger.
    /// Kept with the fingerprint it was seen for.
    pub(super) fresh_until: Option<(String, Instant)>,
    /// The changes this follower had read when it last saw the newest
    /// snapshot fresh: those read since are what the snapshot lacks.
    pub(super) changes_at_fresh: u64,
}

impl<P> Default for Fleet<P> {
    fn default() -> Self {
        Self {
            fingerprint: None,
            position: None,
            scanned_at: None,
            refused: HashSet::new(),
            trigger_versions: None,
            rates: Rates::default(),
            fresh_until: None,
            changes_at_fresh: 0,
            expected_keys: 0,
        }
    }
}

/// Why a snapshot could not be completed from the feed.
#[derive(Debug, thiserror::Error)]
enum AdoptFailure {
    #[error("the snapshot is older than the change feed's pruned horizon")]
    Pruned,
    #[error("the feed's triggers were reinstalled after the snapshot: it may lack keys written without them")]
    Resync,
    #[error("the snapshot's feed position {0:?} cannot be read")]
    Position(String),
    #[error("a watched table was truncated after the snapshot")]
    Truncated,
    #[error(transparent)]
    Adopt(#[from] bloom_guard::feed::AdoptError),
    #[error(transparent)]
    CatchUp(CatchUpError),
}

impl From<CatchUpError> for AdoptFailure {
    fn from(error: CatchUpError) -> Self {
        match error {
            CatchUpError::Pruned => AdoptFailure::Pruned,
            other => AdoptFailure::CatchUp(other),
        }
    }
}

impl<B: Database> Engine<B> {
    /// The guard's first filter: the newest usable snapshot, completed from
    /// the feed; else a scan, one instance of the fleet at a time, whose
    /// result is published for the others.
    pub(super) async fn first_filter(
        self: std::sync::Arc<Self>,
        source: B::Source,
        start: Clock<B::Position>,
    ) {
        if !self.schedule.snapshots {
            self.scan_first(source).await;
            self.fleet().scanned_at = Some(start.at);
            return;
        }
        if self.adopt_newest(|_| true).await {
            return;
        }
        // Instances starting together queue here: the first scans and
        // publishes, the others adopt what it published.
        let build_lock = match self.backend.stores().lock(self.guard.name()).await {
            Ok(build_lock) => Some(build_lock),
            Err(error) => {
                tracing::debug!(%error, "cannot take the fleet's build lock; scanning without it");
                None
            }
        };
        if build_lock.is_some() && self.adopt_newest(|_| true).await {
            return;
        }
        // A position taken after the lock: the scan that follows has every
        // key committed before it, so the snapshot's replay starts late.
        let now = self.backend.position().await.ok();
        self.scan_first(source).await;
        let scanned_at = now.as_ref().map_or(start.at, |now| now.at);
        self.fleet().scanned_at = Some(scanned_at);
        if let Some(now) = now {
            self.publish(&now).await;
        }
        drop(build_lock);
    }

    /// The first scan, sized from the best figure at hand, and timed.
    async fn scan_first(&self, source: B::Source) {
        let expected = self.fleet().expected_keys;
        let started = Instant::now();
        self.guard.clone().warm_expecting(source, expected).await;
        self.scanned(started);
    }

    /// Records the rate of the scan that started at `started` and just
    /// put its filter in use.
    fn scanned(&self, started: Instant) {
        let keys = self.guard.stats().keys;
        self.fleet().rates.scanned(keys, started.elapsed());
    }

    /// Adopts the newest snapshot if `wanted` says so, it was not refused
    /// before, and completing it from the feed beats a scan; false if
    /// there is none, or it is refused or not worth it now.
    pub(super) async fn adopt_newest(&self, wanted: impl Fn(&Stored) -> bool) -> bool {
        let Some(fingerprint) = self.fleet().fingerprint.clone() else {
            return false;
        };
        let started = Instant::now();
        // What the start read ahead, else the newest snapshot now.
        let loaded = match self.prefetched(&fingerprint).await {
            Some(loaded)
                if wanted(&loaded.stored) && !self.fleet().refused.contains(&loaded.stored.id) =>
            {
                loaded
            }
            _ => match self.load_newest(&fingerprint, wanted).await {
                Some(loaded) => loaded,
                None => return false,
            },
        };
        let Loaded {
            stored,
            snapshot,
            load: loaded,
        } = loaded;
        let snapshot = match snapshot {
            Ok(snapshot) => snapshot,
            Err(LoadError::Snapshot(error)) => return self.refuse(&stored, &error),
            Err(error) => {
                tracing::debug!(%error, "cannot load the filter's snapshot");
                return false;
            }
        };
        let adoption = match self
            .guard
            .feed()
            .begin_adoption(snapshot, &fingerprint)
            .await
        {
            Ok(adoption) => adoption,
            Err(error) => return self.refuse(&stored, &error),
        };
        let position = &adoption.info().position;
        let Some(position) = B::parse_position(position) else {
            return self.refuse(&stored, &AdoptFailure::Position(position.clone()));
        };
        // Worth it only if the feed since fits the filter's room and its
        // replay beats a scan: one bounded count tells.
        let keys = adoption.info().keys;
        let worth = self.fleet().rates.replay_limit(keys).min(adoption.room());
        match self
            .backend
            .pending(&position, worth.saturating_add(1))
            .await
        {
            Ok(pending) if pending > worth => {
                tracing::info!(
                    snapshot = stored.id,
                    snapshot_keys = keys,
                    feed_rows_since = %format_args!("more than {worth}"),
                    "the change feed since the snapshot is longer than a scan; scanning"
                );
                adoption.abandon();
                let mut fleet = self.fleet();
                fleet.expected_keys = fleet.expected_keys.max(keys.saturating_add(pending));
                return false;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "cannot count the feed since the snapshot");
                return false;
            }
        }
        // From the snapshot's position to the present, applied to its
        // filter alone, and in use before the reader loop reads again.
        let replay = Instant::now();
        let mut replayed = 0;
        let adopted = self
            .bring_up_to_date(&position, Candidate::Snapshot, |changes, reached| {
                if changes.resync {
                    return Err(AdoptFailure::Resync);
                }
                if changes.truncated {
                    return Err(AdoptFailure::Truncated);
                }
                replayed = changes.rows;
                adoption.apply(&changes.added, self.deletes(changes), reached);
                adoption.promote().map_err(AdoptFailure::from)
            })
            .await;
        match adopted {
            Ok(_) => self.fleet().rates.replayed(replayed, replay.elapsed()),
            Err(AdoptFailure::CatchUp(CatchUpError::Backend(error))) => {
                tracing::debug!(%error, "cannot replay the feed since the snapshot");
                return false;
            }
            Err(error) => return self.refuse(&stored, &error),
        }
        self.fleet().scanned_at = Some(stored.scanned_at);
        tracing::info!(
            snapshot = stored.id,
            bytes = stored.len,
            load_ms = loaded.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "adopted the filter's snapshot and replayed the feed since"
        );
        true
    }

    /// Never tries `stored` again.
    fn refuse(&self, stored: &Stored, why: &dyn fmt::Display) -> bool {
        tracing::warn!(snapshot = stored.id, why = %why, "refusing the filter's snapshot; scanning instead");
        self.fleet().refused.insert(stored.id);
        false
    }

    /// Adopts a snapshot from a scan newer than the one the filter in use
    /// descends from: another instance rebuilt.
    pub(super) async fn adopt_newer(&self) -> bool {
        let Some(ours) = self.fleet().scanned_at else {
            return false;
        };
        self.adopt_newest(|stored| stored.scanned_at > ours).await
    }

    /// Publishes the filter in use as the guard's newest snapshot at `at`'s
    /// position: every key committed before it is in the filter.
    pub(super) async fn publish(&self, at: &Clock<B::Position>) {
        let Some(fingerprint) = self.fleet().fingerprint.clone() else {
            return;
        };
        publish(&self.backend, &self.guard, &fingerprint, at).await;
    }

    /// A rebuild the guard asked for, once for the fleet: the instance that
    /// gets the build lock scans and publishes, the others adopt that.
    pub(super) async fn fleet_rebuild(&self, source: &B::Source, reason: &str) {
        let build_lock = match self.backend.stores().try_lock(self.guard.name()).await {
            Ok(Some(build_lock)) => build_lock,
            Ok(None) => {
                tracing::debug!(reason, "another instance is rebuilding the filter; adopting its snapshot when it is published");
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot take the fleet's build lock");
                return;
            }
        };
        if !self.adopt_newer().await {
            tracing::info!(reason, "rebuilding the bloom filter for the fleet");
            if let Some(now) = self.rebuild_here(source).await {
                self.publish(&now).await;
            }
        }
        drop(build_lock);
    }

    /// Rebuilds this instance's filter from a scan, whatever the fleet
    /// does: the position taken before the scan, once the new filter is in
    /// use (none if the database gave no position or the rebuild failed).
    /// The filter in use then descends from a scan as new as that
    /// position, so no snapshot published before it counts as newer (its
    /// replay could only bring back what this rebuild was for).
    pub(super) async fn rebuild_here(&self, source: &B::Source) -> Option<Clock<B::Position>> {
        let now = self.backend.position().await.ok()?;
        let started = Instant::now();
        self.guard
            .feed()
            .rebuild_newer_than(source, started)
            .await
            .ok()?;
        self.scanned(started);
        self.fleet().scanned_at = Some(now.at);
        Some(now)
    }
}

/// Publishes `guard`'s filter in use as a snapshot at `at`'s position (its
/// clock as the scan's time), logging the outcome.
pub(super) async fn publish<B: Database>(
    backend: &B,
    guard: &BloomGuard,
    fingerprint: &str,
    at: &Clock<B::Position>,
) {
    let Some(writer) = guard.feed().snapshot(
        &bloom_guard::feed::Position::new(at.position.to_string()),
        fingerprint,
    ) else {
        return;
    };
    let started = std::time::Instant::now();
    let bytes = writer.info().len;
    match backend.stores().snapshots().publish(writer, at.at).await {
        Ok(id) => tracing::info!(
            snapshot = id,
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "published the filter's snapshot"
        ),
        Err(error) => {
            tracing::warn!(%error, "cannot publish the filter's snapshot; instances that start scan instead");
        }
    }
}
