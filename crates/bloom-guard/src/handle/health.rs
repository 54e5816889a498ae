//! A guard's health: whether a filter is in use and holds every key (no
//! hold, no false negative seen, within its rate bound), whether it ever
//! protected, and why not when it does not.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::lock::lock;
use crate::report::stats::{FeedStatus, FeedStorage, FilterOrigin, GuardState};

/// A guard's health, changed by builds, holds, false negatives and the
/// maintenance's rate check; read by requests (`lets_all_through`) and by
/// the stats.
#[derive(Debug)]
pub(crate) struct Health {
    guard: &'static str,
    /// Reasons to let every request through although a filter is in use
    /// (a follower catching up on lost notifications).
    held_open: AtomicUsize,
    /// Why a hold keeps the guard open, if it said, by hold id.
    hold_reasons: Mutex<Vec<(u64, String)>>,
    /// The id of the next hold with a reason.
    next_hold: AtomicU64,
    /// A false negative was seen: the filter in use is not trusted until
    /// the next one is put in place.
    suspect: AtomicBool,
    /// Whether the guard has protected once: its first filter held every
    /// key within the rate bound. Never reset (see [`Self::ready`]).
    protected: AtomicBool,
    /// The filter in use passed the rate bound (seen by the last rate
    /// check); it still answers, and a rebuild is due.
    overfull: AtomicBool,
    /// The generation in use (0: no filter yet), for `ready` to wait on.
    generations: watch::Sender<u64>,
    last_error: Mutex<Option<String>>,
    /// When the filter in use was put in place (tokio's clock, which tests
    /// can pause), and where it came from.
    last_build: Mutex<Option<(Instant, FilterOrigin)>>,
    /// What the change feed reported last, and when.
    feed: Mutex<Option<(FeedStatus, Instant)>>,
    storage: Mutex<Option<FeedStorage>>,
}

impl Health {
    pub(crate) fn new(guard: &'static str) -> Self {
        Self {
            guard,
            held_open: AtomicUsize::new(0),
            hold_reasons: Mutex::new(Vec::new()),
            next_hold: AtomicU64::new(0),
            suspect: AtomicBool::new(false),
            protected: AtomicBool::new(false),
            overfull: AtomicBool::new(false),
            generations: watch::Sender::new(0),
            last_error: Mutex::new(None),
            last_build: Mutex::new(None),
            feed: Mutex::new(None),
            storage: Mutex::new(None),
        }
    }

    /// Whether every request must pass although a filter may be in use: a
    /// hold, or a false negative seen. On the request path: two loads.
    #[inline]
    pub(crate) fn lets_all_through(&self) -> bool {
        self.held_open.load(Ordering::Acquire) > 0 || self.suspect.load(Ordering::Acquire)
    }

    pub(crate) fn held_open(&self) -> bool {
        self.held_open.load(Ordering::Acquire) > 0
    }

    /// The generation of the filter in use; 0 before the first.
    pub(crate) fn generation(&self) -> u64 {
        *self.generations.borrow()
    }

    fn has_filter(&self) -> bool {
        self.generation() > 0
    }

    /// A filter from `origin` was put in use: clears what the last one
    /// carried (failure, overfull, suspicion); its generation.
    pub(crate) fn promoted(&self, origin: FilterOrigin) -> u64 {
        self.overfull.store(false, Ordering::Release);
        *lock(&self.last_error) = None;
        *lock(&self.last_build) = Some((Instant::now(), origin));
        self.suspect.store(false, Ordering::Release);
        let mut generation = 0;
        self.generations.send_modify(|current| {
            *current += 1;
            generation = *current;
        });
        self.check_ready();
        generation
    }

    /// A false negative was seen: fail open until the next filter. Whether
    /// this is news.
    pub(crate) fn suspect_filter(&self) -> bool {
        let news = !self.suspect.swap(true, Ordering::AcqRel);
        if news {
            tracing::warn!(
                guard = self.guard,
                "failing open until the next rebuild, which is due now"
            );
        }
        news
    }

    pub(crate) fn suspect(&self) -> bool {
        self.suspect.load(Ordering::Acquire)
    }

    /// Records whether the filter in use is over its rate bound; whether
    /// that changed.
    pub(crate) fn set_overfull(&self, overfull: bool) -> bool {
        overfull != self.overfull.swap(overfull, Ordering::AcqRel)
    }

    /// Waits until the guard protects: a filter in use that holds every
    /// key (no hold, no false negative seen) within the rate bound. Once
    /// it has, it stays ready: a later degradation fails the guard open and
    /// shows in [`Self::state`], not here.
    pub(crate) async fn ready(&self) {
        let mut generations = self.generations.subscribe();
        let _ = generations.wait_for(|_| self.is_ready()).await;
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.protected.load(Ordering::Acquire)
    }

    /// Marks the guard ready if it protects now, and wakes its waiters.
    fn check_ready(&self) {
        if self.is_ready()
            || self.state_now() != GuardState::Ready
            || self.overfull.load(Ordering::Acquire)
        {
            return;
        }
        if !self.protected.swap(true, Ordering::AcqRel) {
            tracing::info!(guard = self.guard, "the guard protects: ready");
            self.generations.send_modify(|_| {});
        }
    }

    pub(crate) fn hold_open(&self) {
        self.held_open.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn release_open(&self) {
        self.held_open.fetch_sub(1, Ordering::AcqRel);
        self.check_ready();
    }

    /// Records why a hold keeps the guard open; its id, to forget it.
    pub(crate) fn add_hold_reason(&self, reason: String) -> u64 {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        lock(&self.hold_reasons).push((id, reason));
        id
    }

    pub(crate) fn remove_hold_reason(&self, id: u64) {
        lock(&self.hold_reasons).retain(|(held, _)| *held != id);
    }

    /// The reasons of the holds that gave one, oldest first.
    fn hold_reason(&self) -> Option<String> {
        let reasons = lock(&self.hold_reasons);
        (!reasons.is_empty()).then(|| {
            reasons
                .iter()
                .map(|(_, reason)| reason.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    pub(crate) fn record_failure(&self, error: String) {
        *lock(&self.last_error) = Some(error);
    }

    /// Records a feed read's status; how many changes, reads and shared
    /// reads it counts since the last (a follower that starts again counts
    /// from 0).
    pub(crate) fn record_feed(&self, status: FeedStatus) -> [u64; 3] {
        let mut feed = lock(&self.feed);
        let since = |now: u64, before: Option<u64>| {
            before.map_or(now, |before| now.checked_sub(before).unwrap_or(now))
        };
        let last = feed.as_ref().map(|(last, _)| last);
        let new = [
            since(status.changes, last.map(|last| last.changes)),
            since(status.reads, last.map(|last| last.reads)),
            since(status.shared_reads, last.map(|last| last.shared_reads)),
        ];
        *feed = Some((status, Instant::now()));
        new
    }

    pub(crate) fn record_storage(&self, storage: FeedStorage) {
        *lock(&self.storage) = Some(storage);
    }

    /// The last feed status, with its age and the feed's storage.
    pub(crate) fn feed(&self) -> Option<FeedStatus> {
        lock(&self.feed).as_ref().map(|(status, at)| {
            let mut status = status.clone();
            status.read_ago_ms = at.elapsed().as_millis() as u64;
            status.storage = *lock(&self.storage);
            status
        })
    }

    /// Where the guard is in its life (cheap: no look at the filter's bits).
    /// Until it has protected once, it is warming (degraded while no filter
    /// could be built).
    pub(crate) fn state(&self) -> GuardState {
        match self.state_now() {
            GuardState::Ready if self.overfull.load(Ordering::Acquire) => GuardState::Degraded,
            // A filter in use that does not protect yet: still warming.
            GuardState::Degraded if !self.is_ready() && self.has_filter() => GuardState::Warming,
            state => state,
        }
    }

    /// Whether a filter is in use that holds every key, as far as the
    /// guard knows without reading its bits.
    fn state_now(&self) -> GuardState {
        // Without a filter, a recorded failure means the first build failed;
        // with one, only a hold makes the guard let everything through.
        if !self.has_filter() {
            if lock(&self.last_error).is_some() {
                return GuardState::Degraded;
            }
            return GuardState::Warming;
        }
        if self.lets_all_through() {
            return GuardState::Degraded;
        }
        GuardState::Ready
    }

    /// Why the guard lets every request through, or answers less well than
    /// it should; `None` when it protects.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.has_filter() {
            return Some(match lock(&self.last_error).clone() {
                Some(error) => format!("the first filter cannot be built: {error}"),
                None => "building the first filter".to_owned(),
            });
        }
        if self.suspect() {
            return Some(
                "a false negative was seen: failing open until the next rebuild".to_owned(),
            );
        }
        if self.held_open() {
            return Some(self.hold_reason().unwrap_or_else(|| {
                "held open: the filter may lack keys until the change feed is read".to_owned()
            }));
        }
        if self.overfull.load(Ordering::Acquire) {
            return Some("the filter passed its false-positive bound: a rebuild is due".to_owned());
        }
        None
    }

    /// The last error, or else why the holds keep the guard open.
    pub(crate) fn last_error(&self) -> Option<String> {
        lock(&self.last_error)
            .clone()
            .or_else(|| self.hold_reason())
    }

    pub(crate) fn last_build(&self) -> Option<(Instant, FilterOrigin)> {
        *lock(&self.last_build)
    }
}
