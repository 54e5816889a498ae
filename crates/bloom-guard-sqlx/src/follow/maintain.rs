//! Maintenance on an interval: the trigger check, pruning, snapshots and
//! the guard's rebuilds.

use std::sync::Arc;
use std::time::Duration;

use bloom_guard::FailOpen;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Database, Engine};
use crate::follow::column;

/// How late the feed's pruning may be before it is logged: a few of its
/// rounds.
const OVERDUE_AFTER: Duration = Duration::from_secs(300);

/// Every how many checks the key columns are looked at again.
const COLUMNS_EVERY: u32 = 6;

/// How often the feed is pruned at most.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Watched tables whose writes can bypass the feed.
#[derive(Debug, thiserror::Error)]
#[error("writes can bypass the change feed: {0}")]
struct GapError(String);

impl<B: Database> Engine<B> {
    /// Checks the triggers, prunes the feed, and rebuilds when due.
    pub(super) async fn maintain(
        self: Arc<Self>,
        source: B::Source,
        resync: Arc<Notify>,
        published: Arc<Notify>,
        (mut gap, checked): (Option<FailOpen>, bool),
    ) {
        let feed = self.backend.feed();
        // A check the start ran is not repeated at once: the first tick is
        // one interval away. A check that could not run is tried again now.
        let first = if checked {
            tokio::time::Instant::now() + self.schedule.check_interval
        } else {
            tokio::time::Instant::now()
        };
        let mut ticks = tokio::time::interval_at(first, self.schedule.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune: Option<Instant> = None;
        let mut last_look: Option<Instant> = None;
        let mut overdue = false;
        // The key columns again, every few checks: a column altered to
        // another collation or type while the follower runs.
        let mut columns_looked_at = Instant::now();
        let mut columns_hold = None;
        loop {
            let resync_requested = tokio::select! {
                _ = ticks.tick() => false,
                () = resync.notified() => true,
                () = self.rebuilds.soon.notified() => false,
                () = published.notified() => {
                    // Anyone may NOTIFY: one look per second at most, and
                    // the checks go on meanwhile.
                    if self.schedule.snapshots
                        && gap.is_none()
                        && last_look.is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
                    {
                        last_look = Some(Instant::now());
                        self.adopt_newer().await;
                    }
                    continue;
                }
            };
            if resync_requested {
                self.hold_for_unrecorded();
            }
            // A resync may come from an ALTER of a key column (Postgres's
            // event trigger records one): looked at before the rebuild
            // that ends the resync's hold.
            if resync_requested
                || columns_looked_at.elapsed() >= self.schedule.check_interval * COLUMNS_EVERY
            {
                columns_looked_at = Instant::now();
                self.look_at_key_columns(&mut columns_hold).await;
            }
            // The check reads whether the functions count rows too.
            let checked = self.check(&source, &mut gap).await;
            // Writes the feed could not record keep the guard open until a
            // rebuild has them, retried at every check that found no gap
            // (a check that could not run proves nothing).
            let unrecorded = crate::lock::lock(&self.holds.unrecorded).is_some();
            let resyncs = self
                .rebuilds
                .resyncs
                .load(std::sync::atomic::Ordering::Acquire);
            if unrecorded
                && checked
                && gap.is_none()
                && self.rebuild_here(&source).await.is_some()
                // A resync read while the rebuild ran may postdate its scan.
                && self.rebuilds.resyncs.load(std::sync::atomic::Ordering::Acquire) == resyncs
            {
                crate::lock::lock(&self.holds.unrecorded).take();
            }
            if last_prune.is_none_or(|at| at.elapsed() >= self.schedule.retention.min(PRUNE_EVERY))
            {
                match self.backend.prune(self.schedule.retention).await {
                    Ok(0) => {}
                    Ok(pruned) => tracing::debug!(feed, pruned, "pruned the change feed"),
                    Err(error) => tracing::debug!(%error, "cannot prune the change feed"),
                }
                if let Ok(Some(storage)) = self.backend.storage(self.schedule.retention).await {
                    // Logged once per spell; the metric shows it throughout.
                    let late = storage.prune_overdue_secs > OVERDUE_AFTER.as_secs();
                    if late && !overdue {
                        tracing::warn!(feed, overdue_secs = storage.prune_overdue_secs, "the change feed's pruning is overdue: a long or prepared transaction holds it back (pg_stat_activity, pg_prepared_xacts)");
                    }
                    overdue = late;
                    self.guard.feed().record_storage(storage);
                }
                last_prune = Some(Instant::now());
            }
            if self.schedule.snapshots && gap.is_none() {
                // Where publications are announced, the wake-up above
                // adopts them (and a listener that reconnects is woken).
                if !self.backend.announces_changes() {
                    self.adopt_newer().await;
                }
                self.republish_if_stale().await;
            }
            // A truncation: this instance scans the (emptied) table itself,
            // whatever the fleet does: a snapshot from before it would
            // bring its keys back.
            if self
                .rebuilds
                .here
                .swap(false, std::sync::atomic::Ordering::AcqRel)
                && self.rebuild_here(&source).await.is_none()
            {
                self.rebuilds
                    .here
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            if let Some(reason) = self.guard.feed().rebuild_due() {
                if self.schedule.snapshots {
                    self.fleet_rebuild(&source, reason).await;
                } else {
                    tracing::info!(feed, reason, "rebuilding the bloom filter");
                    let _ = self.guard.rebuild(&source).await;
                }
            }
        }
    }

    /// Fails the guard open while a watched table can take writes the
    /// feed does not see; after the repair, rebuilds before closing again.
    /// Whether the check ran.
    pub(super) async fn check(&self, source: &B::Source, gap: &mut Option<FailOpen>) -> bool {
        let feed = self.backend.feed();
        let catalog = match self.backend.catalog().await {
            Ok(catalog) => catalog,
            Err(error) => {
                tracing::debug!(%error, "cannot check the change feed's triggers");
                return false;
            }
        };
        if let Some(counts_rows) = catalog.counts_rows {
            self.set_counts_rows(counts_rows);
        }
        let mut gaps = catalog.gaps;
        // Held until the gaps are looked at again: a trigger dropped
        // between two queries changed the versions but showed no gap yet,
        // and the rebuild must not leave the guard answering without it.
        let versions_hold = match catalog.versions {
            Some(versions) if gaps.is_empty() && gap.is_none() => {
                self.check_trigger_versions(source, versions).await
            }
            _ => None,
        };
        if versions_hold.is_some() {
            gaps = match self.backend.gaps().await {
                Ok(gaps) => gaps,
                Err(error) => {
                    tracing::debug!(%error, "cannot check the change feed's triggers");
                    return false;
                }
            };
        }
        if gaps.is_empty() {
            if gap.is_some() {
                tracing::info!(feed, "the change feed's triggers are back; rebuilding before answering absent keys again");
                // The rebuild has whatever the gap let through: the trigger
                // check and the snapshots start from here.
                let now = self.backend.key_source().await.ok();
                if self
                    .guard
                    .feed()
                    .rebuild_newer_than(source, Instant::now())
                    .await
                    .is_ok()
                {
                    if let Some(keys) = now {
                        let mut fleet = self.fleet();
                        fleet.fingerprint = Some(keys.fingerprint);
                        fleet.trigger_versions = Some(keys.trigger_versions);
                    }
                    *gap = None;
                    tracing::info!(
                        feed,
                        "rebuilt after the repair; the guard answers absent keys again"
                    );
                }
            }
            return true;
        }
        let problem = GapError(gaps.join("; "));
        let new_gap = gap.is_none();
        if new_gap {
            tracing::error!(feed, gaps = %problem.0, "writes to a watched table can bypass the change feed; the guard lets every request through until this is repaired (run Watch::install or select bloom_guard.watch(...) again)");
            *gap = Some(self.guard.feed().fail_open_because(problem.to_string()));
        }
        self.guard.report_unavailable(&problem);
        // The table in use gets the triggers if this role may; the next
        // check sees the repair and rebuilds.
        match self.backend.repair().await {
            Ok(true) => tracing::warn!(feed, "put the feed's triggers on the table the key query reads now; rebuilding at the next check"),
            Ok(false) => {}
            Err(error) if new_gap => tracing::warn!(feed, error = %crate::error::error_chain(&error), "cannot put the feed's triggers on the table the key query reads now; watch it as its owner"),
            Err(_) => {}
        }
        true
    }

    /// Rebuilds if a watched table was recreated or a feed trigger altered
    /// since the last check: a trigger disabled for a bulk load and enabled
    /// again shows no gap, but the keys loaded meanwhile are not in the
    /// feed. The guard fails open until the rebuild is in place.
    /// The hold it took, if the versions changed: the caller looks at the
    /// gaps again before letting go.
    async fn check_trigger_versions(
        &self,
        source: &B::Source,
        versions: String,
    ) -> Option<FailOpen> {
        let previous = self.fleet().trigger_versions.replace(versions.clone());
        if previous
            .as_ref()
            .is_none_or(|previous| *previous == versions)
        {
            return None;
        }
        tracing::error!(feed = self.backend.feed(), "a watched table was recreated or a feed trigger altered since the last check (disabled and enabled again?): writes may have bypassed the change feed; rebuilding, the guard lets every request through meanwhile");
        let hold = self.guard.feed().fail_open_because(
            "a watched table was recreated or a feed trigger altered: rebuilding",
        );
        // Snapshots from before the change are not this guard's any more.
        if let Ok(keys) = self.backend.key_source().await {
            self.fleet().fingerprint = Some(keys.fingerprint);
        }
        if self
            .guard
            .feed()
            .rebuild_newer_than(source, Instant::now())
            .await
            .is_err()
        {
            // Try again at the next check.
            self.fleet().trigger_versions = previous;
        }
        Some(hold)
    }

    /// Holds the guard open if its key type could refuse a key stored in
    /// the watched column(s).
    pub(super) async fn check_key_type(&self, source: &B::Source) -> Option<FailOpen> {
        let columns = match self.backend.key_columns().await {
            Ok(columns) => columns,
            Err(error) => {
                tracing::warn!(%error, "cannot read the watched key columns' types");
                return None;
            }
        };
        if let Some(hold) = column::enforce(&self.guard, self.backend.watch(), &columns) {
            return Some(hold);
        }
        if column::needs_ascii_keys(self.guard.key_type(), &columns) {
            self.holds
                .ascii_only
                .store(true, std::sync::atomic::Ordering::Release);
            // Until the check has answered, no key is known to be safe.
            let checking = self
                .guard
                .feed()
                .fail_open_because("checking the stored keys' characters");
            let unsafe_keys = self.backend.has_unsafe_keys(source).await;
            drop(checking);
            if !matches!(unsafe_keys, Ok(false)) {
                self.hold_for_unsafe_key();
            }
        }
        None
    }

    /// Checks the key columns against the guard's key type again: one that
    /// no longer compares as the key type does (altered since the start)
    /// holds the guard open, logged once, until it does again.
    async fn look_at_key_columns(&self, hold: &mut Option<FailOpen>) {
        let Ok(columns) = self.backend.key_columns().await else {
            return;
        };
        match column::check(&self.backend.watch().table, self.guard.key_type(), &columns) {
            column::Verdict::Refused(problem) => {
                if hold.is_none() {
                    tracing::error!(guard = self.guard.name(), %problem, "a watched key column changed and no longer compares as the guard's key type; the guard lets every request through");
                    *hold = Some(self.guard.feed().fail_open_because(problem));
                }
            }
            column::Verdict::Fits | column::Verdict::FitsWithCaveat(_) => {
                if hold.take().is_some() {
                    tracing::info!(
                        guard = self.guard.name(),
                        "the watched key columns compare as the guard's key type again"
                    );
                }
            }
        }
    }

    /// Holds the guard open for writes the feed could not record, until a
    /// rebuild that started after the last of them has them.
    pub(super) fn hold_for_unrecorded(&self) {
        self.rebuilds
            .resyncs
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut held = crate::lock::lock(&self.holds.unrecorded);
        if held.is_none() {
            tracing::warn!(
                guard = self.guard.name(),
                "the change feed reports writes it could not record (its triggers installed again, or a key column renamed or dropped); the guard lets every request through until a rebuild has them"
            );
            *held = Some(self.guard.feed().fail_open_because(
                "writes the change feed could not record (its triggers installed again, or a key column renamed): rebuilding",
            ));
        }
    }

    /// Keeps the guard open from now on: a stored key may be equal, for the
    /// database, to spellings the key type cannot reproduce.
    pub(super) fn hold_for_unsafe_key(&self) {
        let mut held = crate::lock::lock(&self.holds.unsafe_key);
        if held.is_none() {
            tracing::error!(
                guard = self.guard.name(),
                problem = column::UNSAFE_KEY,
                "the guard's key type cannot compare every stored key as the watched column does"
            );
            *held = Some(self.guard.feed().fail_open_because(column::UNSAFE_KEY));
        }
    }
}
