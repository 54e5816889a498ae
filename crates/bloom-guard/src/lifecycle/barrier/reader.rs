//! The follower's side of the barrier.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::lookup::{KeyLookup, Lookups};
use super::slot::Slot;
use super::Barrier;
use crate::handle::shared::Shared;
use crate::lifecycle::catch_up::CatchUp;

/// A follower's side of a guard's read barrier: it learns when a refusal
/// waits, and tells when a read's keys are in the filter.
///
/// Made by [`FeedHandle::reader`](crate::feed::FeedHandle::reader);
/// while one exists, every would-be refusal of the guard waits for a feed
/// read that began after the request arrived (within the guard's
/// [`read_barrier_timeout`](crate::Builder::read_barrier_timeout)), then
/// looks the key up again. Dropping it (the follower stopped) ends the
/// waits; once the guard's last reader is gone, its filter no longer
/// follows the table, and would-be refusals go on to the handler until a
/// reader joins again.
///
/// # Reads and their pace
///
/// Reads are numbered by [`begin`](Self::begin): a refusal waits for the
/// first read to begin after it arrived, so a read must take its snapshot
/// or position after `begin` returns. [`asked`](Self::asked) completes when
/// a refusal waits and the guard's [`ReadPace`](crate::feed::ReadPace) lets the
/// next read start.
///
/// # Example
///
/// A reader loop: mark the start before the read's snapshot is taken, put
/// the keys in the filter, then mark the read done.
///
/// ```
/// use bloom_guard::{BloomGuard, keys::KeyBatch};
///
/// # async fn read_feed() -> KeyBatch { KeyBatch::default() }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = BloomGuard::builder().build();
/// let reader = guard.feed().reader();
/// # let mut rounds = 0;
/// loop {
///     let read = reader.begin();
///     guard.insert_batch(&read_feed().await);
///     reader.done(read);
///     # rounds += 1; if rounds == 2 { break; }
///     tokio::select! {
///         () = reader.asked() => {}
///         () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct FeedReader {
    barrier: Arc<Barrier>,
    slot: Arc<Slot>,
    /// The pace's memory of the reads refusals asked for.
    pace: Mutex<Paced>,
    /// The guard it reads for, to register its catch-up with.
    shared: Option<Arc<Shared>>,
}

/// When the last read that refusals asked for began, and the asks counted
/// then; whether the next read is one they asked for. Reads of wake-ups
/// and intervals do not count: a refusal right after one is read for at
/// once.
#[derive(Debug)]
struct Paced {
    began: Instant,
    asks: u64,
    next_asked: bool,
}

/// How often a reader pacing a read looks at the refusals waiting on the
/// readers its reads also serve.
const COMPANY_TICK: std::time::Duration = std::time::Duration::from_millis(1);

/// One feed read, from [`FeedReader::begin`].
#[derive(Debug, Clone, Copy)]
#[must_use = "hand it to FeedReader::done once the read's keys are in the filter"]
pub struct ReadStart(u64);

impl FeedReader {
    pub(crate) fn new(barrier: Arc<Barrier>) -> Self {
        let slot = barrier.join();
        Self {
            barrier,
            slot,
            pace: Mutex::new(Paced {
                began: Instant::now(),
                asks: 0,
                next_asked: false,
            }),
            shared: None,
        }
    }

    /// The reader of the guard whose state is `shared`, which from now on
    /// counts as followed by a change feed.
    pub(crate) fn of(shared: Arc<Shared>) -> Self {
        shared.set_fed();
        let mut reader = Self::new(Arc::clone(&shared.barrier));
        if shared.barrier.readers() > 1 {
            // Another follower's reads will reach the filter in use too: its
            // position no longer says which deletes it holds.
            shared.filter_no_longer_exact();
        }
        reader.shared = Some(shared);
        reader
    }

    /// Registers how this follower brings a new counting filter up to
    /// date from the feed before it goes in use (see [`CatchUp`]), for as
    /// long as the reader lives. Without one, a build of a guard with a
    /// follower is put in use without removing deleted keys until the next
    /// rebuild (harmless false positives).
    pub fn catch_up_with(&self, catch_up: impl CatchUp) {
        if let Some(shared) = &self.shared {
            shared.add_catch_up(self.slot.id, Arc::new(catch_up));
        }
    }

    /// Registers how this follower looks keys up in its table (see
    /// [`KeyLookup`]), for as long as the reader lives. Once every
    /// follower of the guard has one, a would-be refusal waits for a
    /// lookup begun after it arrived instead of a feed read, within the
    /// same bound (a statement that takes longer is given up); a key
    /// found, or a lookup that fails or does not answer in time, goes on
    /// to the handler. After a lookup failed, would-be refusals go on at
    /// once (counted as barrier timeouts) until one succeeds again: the
    /// next try, paced at most one per 100 ms, looks up one of their
    /// keys. The lookup must find every row of a key the guard's
    /// key type calls equal to it: register one only for a table whose key
    /// column compares keys exactly as the key type does.
    pub fn look_up_with(&self, lookup: impl KeyLookup) {
        let key_type = self
            .shared
            .as_ref()
            .map_or_else(Default::default, |shared| shared.config.key_type);
        let bound = self.barrier.bound.unwrap_or_default();
        self.slot.lookup.store(Some(Arc::new(Lookups::new(
            Box::new(lookup),
            key_type,
            bound,
        ))));
    }

    /// Completes when a refusal waits for a read and the guard's
    /// [`ReadPace`](crate::feed::ReadPace) lets one start: at once while refusals
    /// are few; in a flood, once enough refusals share the read or the
    /// pace's gap since the last read's start is over, and within its
    /// ceiling.
    /// Read the feed then.
    ///
    /// Cancel-safe: a refusal's ask stays until the next
    /// [`begin`](Self::begin).
    pub async fn asked(&self) {
        self.asked_with(&[]).await;
    }

    /// [`asked`](Self::asked), for a reader whose reads also serve the
    /// waiting refusals of `others`: readers of other guards whose feeds
    /// one statement reads with this one's (their reads begun with
    /// [`begin_if_asked`](Self::begin_if_asked)). Their waiting refusals
    /// count toward a read's company, and of the readers that have company
    /// enough, the one with the most refusals waiting reads (ties: the
    /// reader made first in the process), so a flood over several guards
    /// shares reads as a flood over one does.
    ///
    /// Cancel-safe, as [`asked`](Self::asked).
    pub async fn asked_with(&self, others: &[&FeedReader]) {
        let pace = &self.barrier.pace;
        loop {
            while !self.slot.asked() {
                let woken = self.slot.wake.notified();
                if self.slot.asked() {
                    break;
                }
                woken.await;
            }
            // Looked at again on every pass: a read made for this reader by
            // another's statement ([`begin_if_asked`](Self::begin_if_asked))
            // took the asks so far and started the gap again.
            let (began, asks_then) = {
                let paced = self.pace.lock();
                (paced.began, paced.asks)
            };
            let gap_over = began + pace.gap();
            let (now, asks) = (Instant::now(), self.slot.asks_since(asks_then));
            let company = asks >= pace.per_read() || self.leads_company(asks, others);
            if now >= gap_over || company || pace.quiet(asks, now - began) {
                break;
            }
            // Woken by the ask that makes company enough, or the gap over;
            // with others, looking at their asks every tick.
            let until = if others.is_empty() {
                gap_over
            } else {
                gap_over.min(now + COMPANY_TICK)
            };
            let _ = tokio::time::timeout_at(until, self.slot.wake.notified()).await;
        }
        pace.admit().await;
        self.pace.lock().next_asked = true;
    }

    /// Whether `asks` refusals waiting here and those waiting on `others`
    /// make company enough for a read, and this reader has the most of
    /// them waiting.
    fn leads_company(&self, asks: u64, others: &[&FeedReader]) -> bool {
        if others.is_empty() {
            return false;
        }
        let mut all = asks;
        for other in others {
            let theirs = other.waiting();
            if theirs > asks || (theirs == asks && other.slot.id < self.slot.id) {
                return false;
            }
            all += theirs;
        }
        all >= self.barrier.pace.per_read()
    }

    /// Refusals that asked since this reader's last read for refusals
    /// began, while one waits.
    fn waiting(&self) -> u64 {
        if !self.slot.asked() {
            return 0;
        }
        let asks_then = self.pace.lock().asks;
        self.slot.asks_since(asks_then)
    }

    /// Whether a refusal waits for a read now. A reader whose exact reads
    /// cost more than others (the log feed's wait for its producer) may
    /// read without that cost while none does, and without numbering the
    /// read ([`begin`](Self::begin)): a read not numbered goes on no
    /// refusal. A refusal that arrives after this said no makes
    /// [`asked`](Self::asked) complete, and waits for the next numbered
    /// read.
    #[must_use]
    pub fn waited_for(&self) -> bool {
        self.slot.asked() || self.pace.lock().next_asked
    }

    /// Numbers a new read. Call it before the read takes its snapshot or
    /// position: the read then sees every row committed before, and every
    /// refusal that arrived before it waits for a later one.
    pub fn begin(&self) -> ReadStart {
        let mut paced = self.pace.lock();
        let asked = std::mem::take(&mut paced.next_asked);
        let (read, asks) = self.slot.begin(asked.then(|| self.barrier.pace.per_read()));
        if asked {
            paced.began = Instant::now();
            paced.asks = asks;
        }
        ReadStart(read)
    }

    /// Numbers a read that another guard's follower makes on this one's
    /// behalf, if a refusal waits for one: one statement of the database
    /// reading several guards' feeds. `None` when no refusal waits (the
    /// read would only cost the statement rows). Like [`begin`](Self::begin),
    /// call it before the statement takes its snapshot; the read counts as
    /// one refusals asked for, so this reader's own [`asked`](Self::asked)
    /// waits for the refusals that come after it.
    pub fn begin_if_asked(&self) -> Option<ReadStart> {
        let mut paced = self.pace.lock();
        if !self.slot.asked() || paced.next_asked {
            // No refusal waits, or this reader's own read is about to begin.
            return None;
        }
        let (read, asks) = self.slot.begin(Some(self.barrier.pace.per_read()));
        paced.began = Instant::now();
        paced.asks = asks;
        Some(ReadStart(read))
    }

    /// Marks the read `start` done: its keys are in the filter. Every
    /// refusal that arrived before it began goes on.
    pub fn done(&self, start: ReadStart) {
        let before = self.slot.done(start.0);
        self.barrier.read_done(before, start.0);
    }

    /// Marks a read failed (the database unreachable): until a read is
    /// [`done`](Self::done), would-be refusals go on to the handler at
    /// once instead of waiting out the bound for a read that cannot come.
    pub fn failed(&self) {
        self.slot
            .failing
            .store(true, std::sync::atomic::Ordering::Release);
        // Waiters go on at once instead of waiting out the bound.
        self.barrier.wake_all();
    }
}

impl Drop for FeedReader {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.remove_catch_up(self.slot.id);
        }
        self.barrier.leave(self.slot.id);
    }
}
