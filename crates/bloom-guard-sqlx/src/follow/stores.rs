//! The tables a fleet shares, as the engine sees them: the snapshots and
//! the fleet's settings and members a backend keeps, and its build lock.

use std::future::Future;

use bloom_guard::snapshot::{Snapshot, SnapshotError, SnapshotWriter};

use crate::follow::error::BackendError;

/// A stored snapshot, as listed.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) id: i64,
    pub(crate) len: i64,
    /// When the scan its filter descends from started (µs since the epoch,
    /// the database's clock).
    pub(crate) scanned_at: i64,
    /// Seconds since it was published.
    pub(crate) age_secs: f64,
}

/// Why a stored snapshot was not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// The database failed: try again later.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The snapshot is damaged or of another format: never use it.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// The tables a fleet shares: snapshots, the fleet's settings and
/// members, and the build lock.
pub(crate) trait Stores: Send + Sync + 'static {
    /// The fleet's lock on building the guard's filter, released when
    /// dropped (a crashed holder frees it too).
    type Lock: Send + Sync + 'static;
    /// Where snapshots are kept.
    type Snapshots: SnapshotStore;
    /// Where the fleet's settings and heartbeats are kept.
    type Fleet: FleetTable;

    /// Where the guard's snapshots are kept.
    fn snapshots(&self) -> &Self::Snapshots;

    /// Where the fleet's settings and heartbeats are kept.
    fn fleet(&self) -> &Self::Fleet;

    /// Waits for the fleet's build lock of `guard`.
    fn lock(&self, guard: &str) -> impl Future<Output = Result<Self::Lock, BackendError>> + Send;

    /// The fleet's build lock of `guard`, if nobody holds it.
    fn try_lock(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<Option<Self::Lock>, BackendError>> + Send;
}

/// Where a backend keeps its snapshots.
pub(crate) trait SnapshotStore: Send + Sync + 'static {
    /// The newest snapshot of `guard` for `fingerprint`.
    fn newest(
        &self,
        guard: &str,
        fingerprint: &str,
    ) -> impl Future<Output = Result<Option<Stored>, sqlx::Error>> + Send;

    /// A stored snapshot, read chunk by chunk and checked.
    fn load(&self, stored: &Stored) -> impl Future<Output = Result<Snapshot, LoadError>> + Send;

    /// Stores `writer`'s snapshot, keeps the newest few, wakes the other
    /// instances; the new snapshot's id.
    fn publish(
        &self,
        writer: SnapshotWriter,
        scanned_at: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

/// Where a backend keeps its fleets' settings and heartbeats.
pub(crate) trait FleetTable: Clone + Send + Sync + 'static {
    /// The stored mode name and audit rate of `guard`, each null if none
    /// was stored.
    fn settings(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<(Option<String>, Option<f64>), sqlx::Error>> + Send;

    /// Stores the mode and the audit rate given for `guard`, keeping the
    /// stored ones of those not given.
    fn store(
        &self,
        guard: &str,
        mode: Option<&'static str>,
        audit_rate: Option<f64>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Forgets the settings stored for `guard`.
    fn reset(&self, guard: &str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Records the heartbeat of instance `id` of `guard` (its report as
    /// JSON), and forgets the instances of `guard` not heard from lately.
    fn beat(
        &self,
        guard: &str,
        id: &str,
        report: String,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The reports of the instances of `guard` heard from lately, with the
    /// milliseconds since, by id.
    fn instances(
        &self,
        guard: &str,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, sqlx::Error>> + Send;

    /// Forgets instance `id` of `guard`: it stopped.
    fn leave(&self, guard: &str, id: &str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}
