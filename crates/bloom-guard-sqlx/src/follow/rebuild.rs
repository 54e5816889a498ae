//! A rebuild requested by an operator, run once for the fleet.

use std::sync::Arc;

use bloom_guard::{BloomGuard, BuildError, Stats};
use tokio::time::Instant;

use super::fleet::publish;
use super::{BackendError, Database, KeySet, SnapshotStore, Stores};

/// The engine of [`FleetRebuild`](crate::FleetRebuild) over one backend.
#[derive(Debug)]
pub(crate) struct Rebuild<B> {
    guard: BloomGuard,
    backend: Arc<B>,
    /// Off: a rebuild of this instance's filter only, from the same keys.
    pub(crate) snapshots: bool,
}

impl<B> Clone for Rebuild<B> {
    fn clone(&self) -> Self {
        Self {
            guard: self.guard.clone(),
            backend: Arc::clone(&self.backend),
            snapshots: self.snapshots,
        }
    }
}

impl<B: Database> Rebuild<B> {
    pub(crate) fn new(guard: BloomGuard, backend: B) -> Self {
        Self {
            guard,
            backend: Arc::new(backend),
            snapshots: true,
        }
    }

    /// Rebuilds once for the fleet: under the build lock, unless a snapshot
    /// from a scan newer than the request is published, scans and
    /// publishes. A failure is reported to the guard too.
    pub(crate) async fn rebuild(&self) -> Result<Stats, BuildError> {
        let failed = |error: BackendError| {
            self.guard.report_unavailable(&error);
            BuildError::Source(Arc::new(error))
        };
        let backend = &*self.backend;
        let name = self.guard.name();
        // The request's time first: a rebuild that another instance starts
        // after it serves this request too.
        let requested = backend.position().await.map_err(failed)?;
        let KeySet {
            source,
            fingerprint,
            ..
        } = backend.key_source().await.map_err(failed)?;
        if !self.snapshots {
            return self.guard.rebuild(&source).await;
        }
        let build_lock = backend.stores().lock(name).await.map_err(failed)?;
        let newer = backend
            .stores()
            .snapshots()
            .newest(name, &fingerprint)
            .await
            .map_err(|error| failed(error.into()))?
            .is_some_and(|stored| stored.scanned_at >= requested.at);
        if newer {
            // Another instance rebuilt after the request; this instance's
            // follower adopts that snapshot.
            tracing::info!(
                guard = name,
                "a rebuild newer than the request was published; not scanning again"
            );
            return Ok(self.guard.stats());
        }
        let now = backend.position().await.map_err(failed)?;
        let built = self
            .guard
            .feed()
            .rebuild_newer_than(&source, Instant::now())
            .await;
        if built.is_ok() {
            publish(backend, &self.guard, &fingerprint, &now).await;
        }
        drop(build_lock);
        built
    }
}
