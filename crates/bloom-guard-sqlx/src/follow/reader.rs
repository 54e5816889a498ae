//! Reading the feed: on every wake-up and interval, forever.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{
    feed::{FeedReader, ReadStart},
    stats::FeedStatus,
};
use tokio::sync::Notify;

use tokio::time::{sleep, sleep_until, Instant};

use super::changes::Changes;
use super::group::{Companion, Membership};
use super::{retry_pauses, BackendError, Database, Engine, Read, MAX_PAUSE};

/// The follower's reads of the feed: its side of the read barrier, the
/// position of the last read applied, and its counts. Owned by the engine,
/// changed by the reader loop (here), a shared read (`group.rs`) and a
/// catch-up (`catch_up.rs`).
#[derive(Debug)]
pub(crate) struct Reading<P> {
    /// The follower's side of the read barrier, joined when the follower
    /// is made: a refusal waits for this follower's first read too, even
    /// while it is still starting.
    pub(crate) barrier: FeedReader,
    /// The feed position of the last read applied to the filter in use;
    /// held from a read's start until it is applied (by the reader loop,
    /// or by a catch-up that puts a new filter in use), so no read is
    /// applied twice or skipped. Shared: another guard's read on the same
    /// database may hold it to read for this one (`group.rs`).
    pub(crate) position: Arc<tokio::sync::Mutex<Option<P>>>,
    /// Wakes the reader loop: a read another guard's statement began for
    /// this one failed.
    pub(crate) now: Notify,
    /// Feed rows read since the follower started.
    pub(crate) rows: AtomicU64,
    /// Feed reads applied since the follower started, and how many of them
    /// were made by another guard's statement.
    pub(crate) made: AtomicU64,
    pub(crate) shared: AtomicU64,
    /// Catch-ups that put a filter in use (and moved `position` past it).
    pub(crate) catch_ups: AtomicU64,
}

impl<P> Reading<P> {
    /// Reads from no position yet, on `barrier`.
    pub(crate) fn new(barrier: FeedReader) -> Self {
        Self {
            barrier,
            position: Arc::new(tokio::sync::Mutex::new(None)),
            now: Notify::new(),
            rows: AtomicU64::new(0),
            made: AtomicU64::new(0),
            shared: AtomicU64::new(0),
            catch_ups: AtomicU64::new(0),
        }
    }
}

/// How often a reader loop waiting for refusals looks up again the
/// guards that share its reads.
const OTHERS_AGAIN: Duration = Duration::from_secs(1);

impl<B: Database> Engine<B> {
    /// Reads the feed from the follower's position on every wake-up and
    /// interval, applying each read to the filter in use. A read refusals
    /// asked for also reads for the waiting refusals of `group`'s other
    /// guards, in one statement.
    pub(super) async fn follow(
        &self,
        source: &B::Source,
        wake: &Notify,
        group: Option<&Membership<B>>,
    ) {
        let feed_name = self.backend.feed();
        let mut failing = false;
        let mut pauses = retry_pauses();
        // The read barrier: refusals wait for a read that began after their
        // request arrived; this loop is that read.
        let reads = &self.reading.barrier;
        loop {
            // Exact, and numbered for the barrier, when a refusal waits or
            // exact reads cost no more; otherwise read what is written.
            let exact = !B::UNWAITED_READS_ARE_CHEAPER || reads.waited_for();
            let started = exact.then(|| reads.begin());
            let mut gap = Duration::ZERO;
            let mut next_poll = self.schedule.poll_interval;
            let mut feed = self.reading.position.lock().await;
            let Some(position) = feed.clone() else {
                // Set before the loop starts.
                return;
            };
            let read = if exact {
                let company = group.map(Membership::company).unwrap_or_default();
                self.read_with(&position, company).await
            } else {
                self.backend.read_unwaited(&position).await
            };
            match read {
                Ok(Read::Changes {
                    position: reached,
                    changes,
                }) => {
                    if failing {
                        tracing::info!(feed = feed_name, "reading the change feed again");
                        failing = false;
                        pauses = retry_pauses();
                    }
                    // The keys first, then the position: a snapshot
                    // published at the position holds every key before it.
                    self.apply_keys(&position, &reached, &changes, true);
                    #[cfg(test)]
                    if let (Some(pause), true) = (&self.between_keys_and_position, changes.rows > 0)
                    {
                        pause.0.notify_one();
                        pause.1.notified().await;
                    }
                    if let Some(soon) = B::revisit(&reached) {
                        next_poll = next_poll.min(soon);
                    }
                    self.apply_position(&mut feed, reached, &changes, started, false);
                    drop(feed);
                    // A wake-up that found nothing may be anyone's NOTIFY:
                    // the next read waits out the gap. Real writes always
                    // bring rows, so they never wait.
                    if changes.rows == 0 {
                        gap = self.schedule.min_read_gap;
                    }
                }
                Ok(Read::Pruned) => {
                    drop(feed);
                    self.catch_up_after_pruning(source).await;
                    continue;
                }
                Err(error) => {
                    drop(feed);
                    // Refusals stop waiting for a read that cannot come.
                    reads.failed();
                    if !failing {
                        tracing::warn!(feed = feed_name, %error, "cannot read the change feed; retrying (keys committed meanwhile arrive once it is back)");
                        failing = true;
                    }
                    // Never longer than the interval: the feed holds what
                    // committed meanwhile, and the sooner it is read the
                    // sooner other instances' keys arrive.
                    let pause = pauses.next().unwrap_or(MAX_PAUSE);
                    sleep(pause.min(self.schedule.poll_interval)).await;
                    continue;
                }
            }
            let gap_over = Instant::now() + gap;
            let poll_at = Instant::now() + next_poll;
            loop {
                // The guards whose waiting refusals this loop's reads serve
                // too, looked up again every second (one that stopped is
                // not kept alive).
                let others = group.map(Membership::others).unwrap_or_default();
                let asks: Vec<_> = others.iter().map(|other| &other.reading.barrier).collect();
                tokio::select! {
                    // A refusal waits: read as soon as the guard's read pace
                    // allows, so the refusals of a flood share reads.
                    () = reads.asked_with(&asks) => break,
                    // Another guard's statement could not read for this one.
                    () = self.reading.now.notified() => break,
                    () = async { sleep_until(gap_over).await; wake.notified().await } => break,
                    () = sleep_until(poll_at) => break,
                    () = sleep(OTHERS_AGAIN), if !others.is_empty() => {}
                }
            }
        }
    }

    /// Reads the feed from `position`, in one statement with the reads of
    /// `company`, which it applies.
    async fn read_with(
        &self,
        position: &B::Position,
        company: Vec<Companion<B>>,
    ) -> Result<Read<B::Position>, BackendError> {
        if company.is_empty() {
            return self.backend.read(position).await;
        }
        let mut reads = Vec::with_capacity(company.len() + 1);
        reads.push((&self.backend, position));
        reads.extend(
            company
                .iter()
                .map(|companion| (&companion.follower.backend, &companion.position)),
        );
        let read = B::read_together(&reads).await;
        drop(reads);
        match read {
            Ok(all) => {
                let mut all = all.into_iter();
                let own = all.next().ok_or(sqlx::Error::RowNotFound.into());
                for companion in company {
                    companion.finish(all.next());
                }
                own
            }
            Err(error) => {
                for companion in company {
                    companion.finish(None);
                }
                Err(error)
            }
        }
    }

    /// Puts the keys of a read from `from` to `reached` in the filter in
    /// use, and notes what else the read brought; tells the hooks if
    /// `tell` (a read made for this follower by another's statement tells
    /// them after its position moved, see `group.rs`).
    pub(super) fn apply_keys(
        &self,
        from: &B::Position,
        reached: &B::Position,
        changes: &Changes,
        tell: bool,
    ) {
        self.reading
            .rows
            .fetch_add(changes.rows, std::sync::atomic::Ordering::Relaxed);
        self.note_read(changes);
        let (from, reached) = (from.to_string(), reached.to_string());
        let positions = (self.read_start(&from, changes), reached.as_str());
        if tell {
            self.hooks
                .apply(&self.guard, self.backend.feed(), changes, positions);
        } else {
            super::changes::Hooks::put(&self.guard, self.backend.feed(), changes, positions);
        }
    }

    /// After [`apply_keys`](Self::apply_keys): moves the feed to the
    /// position the read `started` reached, and lets the refusals that
    /// waited for it go on.
    pub(super) fn apply_position(
        &self,
        feed: &mut Option<B::Position>,
        reached: B::Position,
        changes: &Changes,
        started: Option<ReadStart>,
        shared: bool,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        *feed = Some(reached.clone());
        if let Some(started) = started {
            self.reading.barrier.done(started);
        }
        let reads = self.reading.made.fetch_add(1, Relaxed) + 1;
        let shared_reads =
            self.reading.shared.fetch_add(u64::from(shared), Relaxed) + u64::from(shared);
        if changes.resync {
            tracing::info!(feed = self.backend.feed(), "the feed's triggers were (re)installed; rebuilding to include keys written without them");
            self.rebuilds.resync.notify_one();
        }
        self.guard.feed().record_read(
            FeedStatus::new(reached.to_string(), self.reading.rows.load(Relaxed))
                .with_reads(reads, shared_reads)
                .with_lag(changes.lag),
        );
        self.fleet().position = Some(reached);
    }

    /// What any read (the loop's or a catch-up's) brings besides keys: a
    /// key the key type cannot compare holds the guard open before it is in
    /// the filter, and writes the feed could not record hold it open until
    /// a rebuild has them.
    pub(super) fn note_read(&self, changes: &Changes) {
        if self
            .holds
            .ascii_only
            .load(std::sync::atomic::Ordering::Acquire)
            && changes
                .added
                .iter()
                .any(|key| crate::follow::column::is_unsafe_key(key.as_bytes()))
        {
            self.hold_for_unsafe_key();
        }
        if changes.resync {
            self.hold_for_unrecorded();
        }
        if changes.truncated {
            tracing::info!(
                feed = self.backend.feed(),
                "a watched table was truncated; rebuilding to forget its keys"
            );
            self.rebuilds
                .here
                .store(true, std::sync::atomic::Ordering::Release);
            self.rebuilds.soon.notify_one();
        }
    }

    /// The feed no longer holds every change since this reader's position:
    /// fails open, rebuilds from a scan newer than a new position, and
    /// resumes there (a build brought up to date from its own scan's
    /// position moved the feed already).
    async fn catch_up_after_pruning(&self, source: &B::Source) {
        tracing::warn!(feed = self.backend.feed(), "the change feed cannot continue from this reader's position (pruned past it, or the server's history changed under it); rebuilding, the guard lets every request through meanwhile");
        let _hold = self.guard.fail_open();
        self.hooks.catch_up();
        let mut pauses = retry_pauses();
        loop {
            let position = match self.backend.position().await {
                Ok(now) => now.position,
                Err(_) => {
                    sleep(pauses.next().unwrap_or(MAX_PAUSE)).await;
                    continue;
                }
            };
            let caught_up = self
                .reading
                .catch_ups
                .load(std::sync::atomic::Ordering::Acquire);
            // Only a rebuild that starts after the position was taken scans
            // every row committed before it.
            let since = Instant::now();
            if self
                .guard
                .feed()
                .rebuild_newer_than(source, since)
                .await
                .is_ok()
            {
                let mut feed = self.reading.position.lock().await;
                if self
                    .reading
                    .catch_ups
                    .load(std::sync::atomic::Ordering::Acquire)
                    == caught_up
                {
                    *feed = Some(position);
                }
                return;
            }
            sleep(pauses.next().unwrap_or(MAX_PAUSE)).await;
        }
    }
}
