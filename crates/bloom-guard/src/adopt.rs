//! Writing the filter in use as a snapshot, and putting a snapshot's
//! filter in place after replaying what changed since.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::error::AdoptError;
use crate::filter::Filter;
use crate::guard::BloomGuard;
use crate::scan::Registration;
use crate::snapshot::{Snapshot, SnapshotWriter};
use crate::stats::{FilterOrigin, Stats};

impl BloomGuard {
    /// The filter in use as a snapshot, tagged with the change feed's
    /// `position` and the caller's `fingerprint` of the key query; `None`
    /// while the guard lets every request through (warming, held open, a
    /// false negative seen), when the filter may lack keys.
    ///
    /// Take `position` *before* calling: every key committed before it must
    /// already be in the filter (a follower's last read), so that replaying
    /// the feed from there completes the snapshot. Keys inserted while the
    /// chunks are written may or may not be in them; the replay brings
    /// them.
    ///
    /// The snapshot holds the filter's secret hasher seed: store it where
    /// only the service can read it.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList, Snapshot};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let guard = BloomGuard::builder().name("items").build();
    /// guard.rebuild(&KeyList::new(["apple", "pear"])).await?;
    /// let writer = guard.snapshot("42", "select key from items").expect("a complete filter");
    /// let bytes: Vec<u8> = writer.chunks(1 << 20).flatten().collect();
    ///
    /// // Another instance, later.
    /// let other = BloomGuard::builder().name("items").build();
    /// let snapshot = Snapshot::decode(&bytes)?;
    /// assert_eq!(snapshot.info().position, "42");
    /// other
    ///     .adopt(snapshot, "select key from items", async {
    ///         // Replay the change feed from position 42 here.
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// assert!(other.may_contain("apple") && !other.may_contain("plum"));
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self, position: &str, fingerprint: &str) -> Option<SnapshotWriter> {
        let filter = self.shared.complete_filter()?;
        let config = &self.shared.config;
        Some(SnapshotWriter::new(
            filter,
            config.name,
            config.key_type,
            fingerprint,
            position,
        ))
    }

    /// Puts `snapshot`'s filter in place once `catch_up` has run.
    ///
    /// The snapshot must be this guard's (same name and key type) and of
    /// the key query with `fingerprint`. Its filter is registered for every
    /// insert first, then `catch_up` runs: it must insert (with
    /// [`insert_batch`](Self::insert_batch)) every key committed since the
    /// snapshot's [`position`](crate::SnapshotInfo::position), by replaying
    /// the change feed from there. Then the filter replaces the one in use
    /// and the generation goes up; [`Stats::origin`] says `snapshot`. Builds
    /// and adoptions run one at a time.
    ///
    /// # Errors
    ///
    /// [`AdoptError::Mismatch`] for another guard's, key type's or query's
    /// snapshot; [`AdoptError::CatchUp`] if `catch_up` fails. Either way the
    /// filter in use stays and the snapshot is dropped.
    pub async fn adopt<F, E>(
        &self,
        snapshot: Snapshot,
        fingerprint: &str,
        catch_up: F,
    ) -> Result<Stats, AdoptError>
    where
        F: Future<Output = Result<(), E>>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let shared = &*self.shared;
        let config = &shared.config;
        let (info, parts) = snapshot.into_parts();
        let mismatch = |what, expected: &str, found: &str| AdoptError::Mismatch {
            what,
            expected: expected.to_owned(),
            found: found.to_owned(),
        };
        if info.guard != config.name {
            return Err(mismatch("guard", config.name, &info.guard));
        }
        if info.key_type != config.key_type {
            return Err(mismatch(
                "key type",
                &format!("{:?}", config.key_type),
                &format!("{:?}", info.key_type),
            ));
        }
        if info.fingerprint != fingerprint {
            return Err(mismatch("key query", fingerprint, &info.fingerprint));
        }
        let _one_at_a_time = shared.build_lock.lock().await;
        let started = Instant::now();
        let filter = Arc::new(Filter::from_parts(parts));
        let registration = Registration::new(shared, Arc::clone(&filter));
        if let Err(error) = catch_up.await {
            shared
                .metrics
                .build_finished("snapshot", started.elapsed(), false);
            return Err(AdoptError::CatchUp(Arc::new(error)));
        }
        let generation = registration.promote(FilterOrigin::Snapshot);
        let elapsed = started.elapsed();
        shared.metrics.build_finished("snapshot", elapsed, true);
        tracing::info!(
            guard = config.name,
            generation,
            keys = filter.keys(),
            position = %info.position,
            elapsed_ms = elapsed.as_millis() as u64,
            "bloom filter adopted from a snapshot"
        );
        Ok(self.stats())
    }
}
