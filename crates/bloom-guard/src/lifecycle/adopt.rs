//! Writing the filter in use as a snapshot, and putting a snapshot's
//! filter in place after replaying what changed since.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::error::AdoptError;
use crate::filters::filter::Filter;
use crate::handle::feed::{FeedHandle, Position};
use crate::handle::guard::BloomGuard;
use crate::lifecycle::scan::Registration;
use crate::lifecycle::snapshot::{Snapshot, SnapshotInfo, SnapshotWriter};
use crate::report::stats::{FilterOrigin, Stats};

impl<'g> FeedHandle<'g> {
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
    /// A counting filter (a guard that follows a change feed) is taken
    /// at once, with the feed position of the last read applied to it
    /// (without a copy: a shard that changes before its chunk is made is
    /// copied then), and
    /// `position` is not used: its adopter must apply each later delete
    /// exactly once. `None` for one that cannot say which rows it holds
    /// (built without a feed position) or that overflowed.
    ///
    /// The snapshot holds the filter's secret hasher seed: store it where
    /// only the service can read it.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList, snapshot::Snapshot};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let guard = BloomGuard::builder().name("items").build();
    /// guard.rebuild(&KeyList::new(["apple", "pear"])).await?;
    /// let writer = guard.feed().snapshot(&"42".into(), "select key from items").expect("a complete filter");
    /// let bytes: Vec<u8> = writer.chunks(1 << 20).flatten().collect();
    ///
    /// // Another instance, later.
    /// let other = BloomGuard::builder().name("items").build();
    /// let snapshot = Snapshot::decode(&bytes)?;
    /// assert_eq!(snapshot.info().position, "42");
    /// other
    ///     .feed()
    ///     .adopt(snapshot, "select key from items", async {
    ///         // Replay the change feed from position 42 here.
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// assert!(other.may_contain("apple") && !other.may_contain("plum"));
    /// # Ok(()) }
    /// ```
    pub fn snapshot(self, position: &Position, fingerprint: &str) -> Option<SnapshotWriter> {
        let filter = self.guard.shared.complete_filter()?;
        let config = &self.guard.shared.config;
        match filter.counting() {
            Some(counting) => {
                SnapshotWriter::counting(counting, config.name, config.key_type, fingerprint)
            }
            None => SnapshotWriter::bloom(
                Arc::clone(&filter),
                config.name,
                config.key_type,
                fingerprint,
                position.as_str(),
            ),
        }
    }

    /// Puts `snapshot`'s filter in place once `catch_up` has run: a
    /// [`begin_adoption`](Self::begin_adoption), the `catch_up`, and a
    /// [`promote`](Adoption::promote) in one call.
    ///
    /// # Errors
    ///
    /// [`AdoptError::Mismatch`] for another guard's, key type's or query's
    /// snapshot; [`AdoptError::CatchUp`] if `catch_up` fails. Either way the
    /// filter in use stays and the snapshot is dropped.
    pub async fn adopt<F, E>(
        self,
        snapshot: Snapshot,
        fingerprint: &str,
        catch_up: F,
    ) -> Result<Stats, AdoptError>
    where
        F: Future<Output = Result<(), E>>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let adoption = self.begin_adoption(snapshot, fingerprint).await?;
        match catch_up.await {
            Ok(()) => adoption.promote(),
            Err(error) => Err(AdoptError::CatchUp(Arc::new(error))),
        }
    }

    /// Starts adopting `snapshot`: checks that it is this guard's (same
    /// name and key type) and of the key query with `fingerprint`, then
    /// registers its filter for every insert, so that keys inserted from
    /// now on (with [`insert`](BloomGuard::insert) or
    /// [`insert_batch`](BloomGuard::insert_batch)) reach it too.
    ///
    /// Then replay into the guard every key committed since the snapshot's
    /// [`position`](crate::snapshot::SnapshotInfo::position) (the change feed from
    /// there), and [`promote`](Adoption::promote): the filter replaces the
    /// one in use and the generation goes up; [`Stats::origin`] says
    /// `snapshot`. Dropping the [`Adoption`] instead keeps the filter in
    /// use. Builds and adoptions run one at a time: this waits for a build
    /// in flight, and builds wait for the adoption.
    ///
    /// # Errors
    ///
    /// [`AdoptError::Mismatch`] for another guard's, key type's or query's
    /// snapshot.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList, snapshot::Snapshot};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let guard = BloomGuard::builder().name("items").build();
    /// guard.rebuild(&KeyList::new(["apple"])).await?;
    /// let writer = guard.feed().snapshot(&"42".into(), "select key from items").expect("a complete filter");
    /// let bytes: Vec<u8> = writer.chunks(1 << 20).flatten().collect();
    ///
    /// let other = BloomGuard::builder().name("items").build();
    /// let adoption = other.feed().begin_adoption(Snapshot::decode(&bytes)?, "select key from items").await?;
    /// assert_eq!(adoption.info().position, "42");
    /// other.insert("pear"); // replayed from the feed since position 42
    /// let stats = adoption.promote()?;
    /// assert_eq!(stats.generation, 1);
    /// assert!(other.may_contain("apple") && other.may_contain("pear"));
    /// # Ok(()) }
    /// ```
    pub async fn begin_adoption(
        self,
        snapshot: Snapshot,
        fingerprint: &str,
    ) -> Result<Adoption<'g>, AdoptError> {
        let shared = &*self.guard.shared;
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
        let wanted = if shared.counts_rows() {
            crate::report::stats::FilterKind::Counting
        } else {
            crate::report::stats::FilterKind::Bloom
        };
        let kind = match &parts {
            crate::filters::filter::FilterParts::Bloom(_) => {
                crate::report::stats::FilterKind::Bloom
            }
            crate::filters::filter::FilterParts::Counting(_) => {
                crate::report::stats::FilterKind::Counting
            }
        };
        if kind != wanted {
            return Err(mismatch("filter kind", wanted.as_str(), kind.as_str()));
        }
        let one_at_a_time = shared.builds.one_at_a_time.lock().await;
        let filter = Filter::from_parts(parts).map_err(|why| AdoptError::Mismatch {
            what: "filter",
            expected: "a counting filter's shards".to_owned(),
            found: why,
        })?;
        if let Some(counting) = filter.counting() {
            // Exactly the rows of its position: the guard's one follower
            // applies the feed from there, each delete once (with several,
            // a position stands for no one feed: no deletes).
            counting.set_position(&info.position);
            let exact = shared.catch_up().is_some();
            counting.set_exact(exact);
            if exact {
                // The catch-up reads from that position whatever the
                // follower reads meanwhile: a row taken from both would
                // count twice, and its delete would leave the key.
                counting.ignore_live_keys();
            }
        }
        let filter = Arc::new(filter);
        Ok(Adoption {
            guard: self.guard,
            registration: Some(Registration::new(shared, Arc::clone(&filter))),
            filter,
            info,
            started: Instant::now(),
            _one_at_a_time: one_at_a_time,
        })
    }
}

/// A snapshot being adopted: its filter takes every insert, and replaces
/// the filter in use on [`promote`](Self::promote). Made by
/// [`FeedHandle::begin_adoption`]; dropped without a promotion, it leaves
/// the filter in use as it was.
pub struct Adoption<'g> {
    guard: &'g BloomGuard,
    registration: Option<Registration<'g>>,
    filter: Arc<Filter>,
    info: SnapshotInfo,
    started: Instant,
    _one_at_a_time: tokio::sync::MutexGuard<'g, ()>,
}

impl Adoption<'_> {
    /// What the snapshot says of itself: its feed position, to replay from.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// How many more keys the snapshot's filter takes before a rebuild is
    /// due to make its sub-filters one again (see
    /// [`Builder::compact_above`](crate::Builder::compact_above)). If the
    /// change feed since the snapshot holds more, replaying it costs a
    /// second build: scanning is the better start.
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList, snapshot::Snapshot};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let guard = BloomGuard::builder().name("items").expected_items(100).headroom(0.0).build();
    /// guard.rebuild(&KeyList::new(["apple"])).await?;
    /// let bytes: Vec<u8> = guard.feed().snapshot(&"42".into(), "q").expect("complete").chunks(4096).flatten().collect();
    ///
    /// let other = BloomGuard::builder().name("items").compact_above(3).build();
    /// let adoption = other.feed().begin_adoption(Snapshot::decode(&bytes)?, "q").await?;
    /// // Sub-filters of 100, 200 and 400 keys, one key in.
    /// assert_eq!(adoption.room(), 699);
    /// # Ok(()) }
    /// ```
    pub fn room(&self) -> u64 {
        let config = &self.guard.shared.config;
        self.filter
            .capacity_within(config.compact_above)
            .saturating_sub(self.filter.keys())
    }

    /// Applies a read of the change feed from the snapshot's
    /// [`position`](SnapshotInfo::position) (or from where the previous
    /// `apply` reached) to the snapshot's filter alone: the added rows'
    /// keys, and for a counting filter the removed rows' keys, each once
    /// per row. A Bloom filter also takes the guard's inserts meanwhile
    /// (see [`begin_adoption`](FeedHandle::begin_adoption)); a counting one
    /// only these reads, which must be applied in order with no read
    /// applied to the filter in use between them and the
    /// [`promote`](Self::promote).
    pub fn apply(
        &self,
        added: &crate::keys::batch::KeyBatch,
        removed: &crate::keys::batch::KeyBatch,
        reached: &str,
    ) {
        let key_type = self.guard.shared.config.key_type;
        let added = key_type.canonical_batch(added);
        match self.filter.counting() {
            Some(counting) => {
                counting.apply(
                    &added,
                    &key_type.canonical_batch(removed),
                    None,
                    Some(reached),
                );
            }
            None => self.filter.insert_batch(&added, &mut Vec::new()),
        }
    }

    /// Drops the adoption, keeping the filter in use, without counting it
    /// as a failed build: for a caller that chose to scan instead (see
    /// [`room`](Self::room)).
    pub fn abandon(mut self) {
        // The registration's drop unregisters the filter.
        self.registration.take();
    }

    /// Puts the snapshot's filter in place of the one in use, and returns
    /// the guard's stats.
    ///
    /// # Errors
    ///
    /// [`AdoptError::Overfull`] if the filter, with what was replayed into
    /// it, is above its false-positive bound: it is dropped and the filter
    /// in use stays. A filter grows sub-filters as keys arrive, so this
    /// takes a snapshot that had already grown past every one it can add.
    pub fn promote(mut self) -> Result<Stats, AdoptError> {
        let shared = &*self.guard.shared;
        let generation = match self.registration.take() {
            Some(registration) => registration.promote(FilterOrigin::Snapshot),
            None => Ok(0),
        };
        let generation = match generation {
            Ok(generation) => generation,
            Err(overfull) => {
                shared
                    .metrics
                    .build_finished("snapshot", self.started.elapsed(), false);
                tracing::warn!(
                    guard = shared.config.name,
                    estimated_fpp = overfull.estimated_fpp,
                    bound = overfull.bound,
                    "the adopted filter is above its false-positive bound; not put in use"
                );
                return Err(AdoptError::Overfull {
                    estimated_fpp: overfull.estimated_fpp,
                    bound: overfull.bound,
                });
            }
        };
        let elapsed = self.started.elapsed();
        shared.metrics.build_finished("snapshot", elapsed, true);
        tracing::info!(
            guard = shared.config.name,
            generation,
            keys = self.filter.keys(),
            sub_filters = self.filter.stage_count(),
            position = %self.info.position,
            elapsed_ms = elapsed.as_millis() as u64,
            "bloom filter adopted from a snapshot"
        );
        Ok(self.guard.stats())
    }
}

impl Drop for Adoption<'_> {
    fn drop(&mut self) {
        if self.registration.is_some() {
            self.guard
                .shared
                .metrics
                .build_finished("snapshot", self.started.elapsed(), false);
        }
    }
}

impl std::fmt::Debug for Adoption<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adoption")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}
