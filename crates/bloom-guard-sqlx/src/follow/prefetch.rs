//! A start's snapshot, read while the start's other statements run.
//!
//! A second start spends most of its time in a few statements (the feed's
//! position, the trigger and key type checks) and in reading the newest
//! snapshot's bytes. Neither needs the other: the snapshot is chosen by
//! the key source's fingerprint alone, and reading it changes nothing. So
//! the read starts as soon as the fingerprint is known, and the first
//! adoption takes what it read. Adopting stays where it was: after the
//! start's position, so the feed's catch-up from the snapshot is ordered
//! as before.

use std::sync::Arc;
use std::time::Duration;

use bloom_guard::snapshot::Snapshot;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::{Database, Engine, LoadError, SnapshotStore, Stored, Stores};

/// A snapshot listed and read ahead of its adoption.
pub(super) struct Loaded {
    pub(super) stored: Stored,
    pub(super) snapshot: Result<Snapshot, LoadError>,
    /// How long its read took.
    pub(super) load: Duration,
}

/// A read under way, for one fingerprint.
pub(super) struct Prefetch {
    fingerprint: String,
    read: AbortOnDropHandle<Option<Loaded>>,
}

impl<B: Database> Engine<B> {
    /// Starts reading the newest snapshot for `fingerprint`, unless one is
    /// already being read for it (a start that tries again) or snapshots
    /// are off.
    pub(super) fn prefetch(self: &Arc<Self>, fingerprint: &str) {
        if !self.schedule.snapshots {
            return;
        }
        let mut slot = crate::lock::lock(&self.prefetched);
        if slot
            .as_ref()
            .is_some_and(|prefetch| prefetch.fingerprint == fingerprint)
        {
            return;
        }
        let this = Arc::clone(self);
        let wanted = fingerprint.to_owned();
        let read = async move { this.load_newest(&wanted, |_| true).await };
        *slot = Some(Prefetch {
            fingerprint: fingerprint.to_owned(),
            read: AbortOnDropHandle::new(tokio::spawn(read.in_current_span())),
        });
    }

    /// What the start read ahead for `fingerprint`, once: `None` if
    /// nothing was read for it, there was no snapshot, or listing failed.
    pub(super) async fn prefetched(&self, fingerprint: &str) -> Option<Loaded> {
        let prefetch = crate::lock::lock(&self.prefetched).take()?;
        if prefetch.fingerprint != fingerprint {
            return None;
        }
        prefetch.read.await.ok().flatten()
    }

    /// The newest snapshot for `fingerprint`, read if `wanted` says so and
    /// it was not refused before: `None` if not, if there is none, or if it
    /// cannot be listed.
    pub(super) async fn load_newest(
        &self,
        fingerprint: &str,
        wanted: impl Fn(&Stored) -> bool,
    ) -> Option<Loaded> {
        let snapshots = self.backend.stores().snapshots();
        let stored = match snapshots.newest(self.guard.name(), fingerprint).await {
            Ok(stored) => stored?,
            Err(error) => {
                tracing::debug!(%error, "cannot list the filter's snapshots");
                return None;
            }
        };
        if !wanted(&stored) || self.fleet().refused.contains(&stored.id) {
            return None;
        }
        let started = Instant::now();
        let snapshot = snapshots.load(&stored).await;
        Some(Loaded {
            stored,
            snapshot,
            load: started.elapsed(),
        })
    }
}
