//! The follower engine: one protocol that keeps a guard complete while the
//! database changes, over a [`Database`] per backend: small traits by role
//! (`backend.rs`: [`Scans`], [`FeedReads`], [`FeedUpkeep`], [`Checks`],
//! [`Wakes`], and the fleet's [`Stores`], which a backend may share with
//! another), gathered by [`Database`].

mod api;
mod backend;
mod catch_up;
pub(crate) mod changes;
pub(crate) mod column;
mod cost;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) mod dialects;
mod error;
mod fleet;
mod group;
mod holds;
mod maintain;
mod prefetch;
mod presence;
mod reader;
mod rebuild;
mod republish;
mod schedule;
mod stores;

#[cfg(test)]
mod fake;

use std::future::Future;
use std::sync::{Arc, Mutex};

use bloom_guard::BloomGuard;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

pub(crate) use crate::backoff::{retry_pauses, MAX_PAUSE};
pub(crate) use crate::store::fleet::FleetTable;
pub(crate) use crate::store::snapshots::{LoadError, SnapshotStore, Stored};
pub(crate) use api::follower_api;
pub use api::Follow;
#[cfg(feature = "postgres")]
pub(crate) use backend::Catalog;
pub(crate) use backend::{
    BackendError, Checks, Clock, Database, FeedReads, FeedUpkeep, KeySet, Read, Scans, WakeUps,
    Wakes,
};
pub(crate) use rebuild::Rebuild;
pub(crate) use stores::Stores;

use crate::error::error_chain;
use crate::follow::changes::{Changes, Hooks};
use fleet::Fleet;
use holds::{Holds, Rebuilds};
use reader::Reading;
use schedule::Schedule;

/// The follower engine over one backend; the public followers wrap it.
pub(crate) struct Engine<B: Database> {
    pub(crate) guard: BloomGuard,
    pub(crate) backend: B,
    /// When it reads, checks, keeps and publishes.
    pub(crate) schedule: Schedule,
    pub(crate) hooks: Hooks,
    /// Its reads: the barrier's side, the position, the counts.
    pub(crate) reading: Reading<B::Position>,
    /// The feed's exactness and the holds that follow from it.
    pub(crate) holds: Holds,
    /// The rebuilds it owes.
    pub(crate) rebuilds: Rebuilds,
    /// The fleet's positions, snapshots and heartbeats as last seen.
    fleet: Mutex<Fleet<B::Position>>,
    /// The start's snapshot, read while its other statements run.
    prefetched: Mutex<Option<prefetch::Prefetch>>,
    /// A test's pause between a read's keys and its position: signals the
    /// first, waits for the second.
    #[cfg(test)]
    pub(super) between_keys_and_position: Option<Arc<(Notify, Notify)>>,
}

impl<B: Database> std::fmt::Debug for Engine<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("guard", &self.guard.name())
            .field("feed", &self.backend.feed())
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

impl<B: Database> Engine<B> {
    /// The engine for `guard` over `backend`, with the defaults.
    pub(crate) fn new(guard: BloomGuard, backend: B) -> Self {
        Self {
            reading: Reading::new(guard.feed().reader()),
            holds: Holds::default(),
            rebuilds: Rebuilds::default(),
            schedule: Schedule::default(),
            hooks: Hooks::default(),
            fleet: Mutex::default(),
            prefetched: Mutex::new(None),
            guard,
            backend,
            #[cfg(test)]
            between_keys_and_position: None,
        }
    }

    /// Runs the protocol until `shutdown` completes.
    pub(crate) async fn run_until(self, shutdown: impl Future<Output = ()>) {
        let span = tracing::info_span!(
            "bloom_guard_follower",
            guard = self.guard.name(),
            feed = self.backend.feed()
        );
        self.follow_until(shutdown).instrument(span).await;
    }

    async fn follow_until(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let this = Arc::new(self);
        let wake = Arc::new(Notify::new());
        let resync = Arc::clone(&this.rebuilds.resync);
        let published = Arc::new(Notify::new());
        let settings = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let wake_ups = WakeUps {
            feed: Arc::clone(&wake),
            published: Arc::clone(&published),
            settings: Arc::clone(&settings),
            guard: this.guard.name().to_owned(),
        };
        let wake_ups = tokio::spawn(
            this.backend
                .wake_ups(wake_ups, stop.clone())
                .in_current_span(),
        );
        // The fleet's settings are in force before the first filter.
        let membership = this.guard.feed().join_fleet(Arc::new(presence::Link(
            this.backend.stores().fleet().clone(),
        )));
        let _ = tokio::time::timeout(presence::SETTINGS_EVERY, this.guard.refresh_settings()).await;
        let presence = AbortOnDropHandle::new(tokio::spawn(
            Arc::clone(&this).keep_in_fleet(settings).in_current_span(),
        ));
        let started = tokio::select! {
            () = &mut shutdown => None,
            started = this.start() => started,
        };
        if let Some((source, start)) = started {
            // Reads start from the position taken before any filter; a
            // build's filter is brought up to date from its own scan's.
            *this.reading.position.lock().await = Some(start.position.clone());
            this.reading
                .barrier
                .catch_up_with(catch_up::CatchUpFrom(Arc::downgrade(&this)));
            if let Some(lookup) = this.backend.key_lookup(this.guard.key_type()).await {
                this.reading.barrier.look_up_with(lookup);
            }
            // For as long as the follower runs, a key type that does not
            // fit its column keeps the guard open.
            let _key_type = this.check_key_type(&source).await;
            // Before the first filter: with a gap, it comes already held open.
            let mut gap = None;
            let checked = this.check(&source, &mut gap).await;
            let first = Arc::clone(&this).first_filter(source.clone(), start.clone());
            let _first = AbortOnDropHandle::new(tokio::spawn(first.in_current_span()));
            let maintenance = Arc::clone(&this).maintain(
                source.clone(),
                Arc::clone(&resync),
                Arc::clone(&published),
                (gap, checked),
            );
            let _maintenance = AbortOnDropHandle::new(tokio::spawn(maintenance.in_current_span()));
            let group = group::Membership::join(&this);
            tokio::select! {
                () = &mut shutdown => {}
                () = this.follow(&source, &wake, group.as_ref()) => {}
            }
        }
        stop.cancel();
        // A snapshot still being read for a start that never adopted it.
        drop(crate::lock::lock(&this.prefetched).take());
        let _ = wake_ups.await;
        this.backend.close().await;
        drop(presence);
        drop(membership);
        this.leave().await;
        tracing::info!(
            feed = this.backend.feed(),
            "stopped following the change feed"
        );
    }

    /// The key source and the feed's position, taken before any filter is
    /// built: the build's scan has every key committed before its snapshot,
    /// the feed every key committed after the position. `None` when the
    /// connections cannot keep a session (a pooler in transaction mode):
    /// logged once, and the follower stops.
    async fn start(self: &Arc<Self>) -> Option<(B::Source, Clock<B::Position>)> {
        let mut pauses = retry_pauses();
        let mut session_checked = false;
        loop {
            // Beside the start's own statements, once.
            let check = async {
                if session_checked {
                    Ok(())
                } else {
                    self.backend.check_session().await
                }
            };
            let attempt = async {
                let keys = self.backend.key_source().await?;
                // The snapshot's bytes come while the statements below run.
                self.prefetch(&keys.fingerprint);
                {
                    let mut fleet = self.fleet();
                    fleet.fingerprint = Some(keys.fingerprint);
                    fleet.trigger_versions = Some(keys.trigger_versions);
                }
                // Known before any filter: a transient failure later keeps
                // the answer, never turns deletes off.
                let counts_rows = self.backend.counts_rows().await?;
                self.set_counts_rows(counts_rows);
                let start = self.backend.position().await?;
                Ok::<_, BackendError>((keys.source, start))
            };
            let (attempt, checked) = tokio::join!(attempt, check);
            let attempt = match checked {
                Ok(()) => {
                    session_checked = true;
                    attempt
                }
                Err(crate::error::FeedError::Database(error)) => Err(error.into()),
                Err(error) => {
                    tracing::error!(error = %error_chain(&error), "cannot follow the change feed through this connection; the guard lets every request through");
                    self.guard.report_unavailable(&error);
                    return None;
                }
            };
            match attempt {
                Ok(started) => return Some(started),
                Err(error) => {
                    let pause = pauses.next().unwrap_or(MAX_PAUSE);
                    tracing::warn!(error = %error_chain(&error), retry_in = ?pause, "cannot start following the change feed; the guard lets every request through");
                    self.guard.report_unavailable(&error);
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// The deletes of a read to pass to a new filter (a build's or a
    /// snapshot's catch-up): none while the feed's triggers may count a row
    /// twice or two rows once.
    pub(crate) fn deletes<'c>(&'c self, changes: &'c Changes) -> &'c bloom_guard::keys::KeyBatch {
        if self
            .holds
            .counts_rows
            .load(std::sync::atomic::Ordering::Acquire)
        {
            &changes.removed
        } else {
            &self.holds.no_keys
        }
    }

    /// Where a read began, as the filter in use is told: a position that
    /// never matches while the feed's triggers may count rows wrongly, or
    /// for a read with a truncation, so the counting filter keeps every
    /// deleted key from then on (counted in `deletes_left`, and never
    /// published as exact) until the rebuild that follows.
    pub(crate) fn read_start<'p>(&self, from: &'p str, changes: &Changes) -> &'p str {
        // A truncation removed rows the feed does not list: the filter holds
        // them until its rebuild, and must not be published as exact.
        if self
            .holds
            .counts_rows
            .load(std::sync::atomic::Ordering::Acquire)
            && !changes.truncated
        {
            from
        } else {
            UNCOUNTED
        }
    }

    /// Whether the feed's functions count rows, as the last check or
    /// start found (a failed check keeps the last answer).
    pub(super) fn set_counts_rows(&self, counts: bool) {
        let before = self
            .holds
            .counts_rows
            .swap(counts, std::sync::atomic::Ordering::AcqRel);
        if counts
            && !before
            && self
                .holds
                .warned_counts
                .load(std::sync::atomic::Ordering::Acquire)
        {
            // The functions were written again: the filter in use kept the
            // deletes meanwhile; a rebuild here makes it exact again.
            tracing::info!(feed = self.backend.feed(), "the feed's trigger functions count rows again; rebuilding to forget the deleted keys kept meanwhile");
            self.rebuilds
                .here
                .store(true, std::sync::atomic::Ordering::Release);
            self.rebuilds.soon.notify_one();
        }
        let warned = self
            .holds
            .warned_counts
            .swap(!counts, std::sync::atomic::Ordering::AcqRel);
        if !counts && !warned {
            tracing::warn!(feed = self.backend.feed(), "the feed's trigger functions predate schema version 7 (installed by a role that does not own them?): deleted keys stay in the filter until `Watch::install` runs as their owner");
        }
    }

    /// What the follower knows of the fleet.
    fn fleet(&self) -> std::sync::MutexGuard<'_, Fleet<B::Position>> {
        crate::lock::lock(&self.fleet)
    }
}

/// The read start told to a counting filter while the feed's triggers may
/// count rows wrongly: no filter stands there.
const UNCOUNTED: &str = "(rows not counted)";
