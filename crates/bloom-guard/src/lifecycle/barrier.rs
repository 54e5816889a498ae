//! The read barrier: before the guard answers "absent", the filter must
//! hold every row committed before the request arrived. A follower proves
//! it with a feed read that began after the request arrived; refusals
//! waiting at one moment share one read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::handle::shared::Shared;
use crate::lifecycle::catch_up::CatchUp;
use crate::lock::lock;

/// One follower's standing with the barrier.
#[derive(Debug)]
struct Reader {
    id: u64,
    /// Wakes this reader: a refusal waits. One stored permit coalesces
    /// every ask made before the reader looks.
    asked: Arc<Notify>,
    /// When its last read whose keys are in the filter began.
    read_from: Option<Instant>,
    /// Its last read failed.
    failing: bool,
}

/// The barrier of one guard: its readers, each with the start of its last
/// read whose keys are in the filter. A guard may have several followers
/// (one per watched table): a refusal waits for a read of every one.
#[derive(Debug)]
pub(crate) struct Barrier {
    /// How long a refusal waits for reads before it goes to the handler;
    /// `None`: the guard has no barrier.
    bound: Option<Duration>,
    /// How many readers there are, for the request path's cheap check.
    count: AtomicUsize,
    /// Whether a reader's last read failed: refusals go on at once,
    /// without waiting for a read that cannot come, until it succeeds.
    failing: AtomicBool,
    /// Every reader left (its follower stopped, or panicked in a hook):
    /// the filter no longer follows the table, so refusals go on at once
    /// until a reader joins again.
    orphaned: AtomicBool,
    readers: Mutex<Vec<Reader>>,
    /// Bumped whenever a reader finishes a read or leaves.
    changed: watch::Sender<u64>,
    next_id: AtomicUsize,
}

impl Barrier {
    pub(crate) fn new(bound: Option<Duration>) -> Self {
        Self {
            bound,
            count: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            readers: Mutex::new(Vec::new()),
            changed: watch::Sender::new(0),
            next_id: AtomicUsize::new(0),
        }
    }

    /// Whether a refusal has a read to wait for, or must go on because
    /// the guard's followers stopped.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.bound.is_some()
            && (self.count.load(Ordering::Acquire) > 0 || self.orphaned.load(Ordering::Acquire))
    }

    /// Waits until every reader has put in the filter the keys of a read
    /// that began after `arrived`; `false` if that did not happen within
    /// the bound, or a reader's last read failed (the database is down or
    /// slow): then the filter may be stale, and the request must go on.
    pub(crate) async fn wait_past(&self, arrived: Instant) -> bool {
        let Some(bound) = self.bound else {
            return false;
        };
        if self.failing.load(Ordering::Acquire) || self.orphaned.load(Ordering::Acquire) {
            return false;
        }
        let mut changes = self.changed.subscribe();
        for reader in lock(&self.readers).iter() {
            reader.asked.notify_one();
        }
        let fresh = changes.wait_for(|_| self.all_read_after(arrived));
        let read = tokio::time::timeout(bound, fresh).await;
        matches!(read, Ok(Ok(_)))
    }

    /// Whether every reader's last read began after `arrived` (and there
    /// is a reader at all).
    fn all_read_after(&self, arrived: Instant) -> bool {
        let readers = lock(&self.readers);
        !readers.is_empty()
            && readers
                .iter()
                .all(|reader| reader.read_from.is_some_and(|started| started > arrived))
    }

    /// How many readers there are.
    pub(crate) fn readers(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn join(&self) -> (u64, Arc<Notify>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        let asked = Arc::new(Notify::new());
        lock(&self.readers).push(Reader {
            id,
            asked: Arc::clone(&asked),
            read_from: None,
            failing: false,
        });
        self.count.fetch_add(1, Ordering::AcqRel);
        self.orphaned.store(false, Ordering::Release);
        (id, asked)
    }

    fn leave(&self, id: u64) {
        let mut readers = lock(&self.readers);
        readers.retain(|reader| reader.id != id);
        self.count.fetch_sub(1, Ordering::AcqRel);
        if readers.is_empty() {
            self.orphaned.store(true, Ordering::Release);
            tracing::info!("the guard's change feed readers stopped; would-be refusals go to the handler from now on");
        }
        self.failing.store(
            readers.iter().any(|reader| reader.failing),
            Ordering::Release,
        );
        drop(readers);
        self.changed.send_modify(|version| *version += 1);
    }

    fn done(&self, id: u64, started: Instant) {
        let mut readers = lock(&self.readers);
        if let Some(reader) = readers.iter_mut().find(|reader| reader.id == id) {
            reader.failing = false;
            if reader.read_from.is_none_or(|last| started > last) {
                reader.read_from = Some(started);
            }
        }
        self.failing.store(
            readers.iter().any(|reader| reader.failing),
            Ordering::Release,
        );
        drop(readers);
        self.changed.send_modify(|version| *version += 1);
    }

    fn failed(&self, id: u64) {
        let mut readers = lock(&self.readers);
        if let Some(reader) = readers.iter_mut().find(|reader| reader.id == id) {
            reader.failing = true;
        }
        self.failing.store(true, Ordering::Release);
    }
}

/// A follower's side of a guard's read barrier: it learns when a refusal
/// waits, and tells when a read's keys are in the filter.
///
/// Made by [`BloomGuard::feed_reader`](crate::BloomGuard::feed_reader);
/// while one exists, every would-be refusal of the guard waits for a feed
/// read that began after the request arrived (within the guard's
/// [`read_barrier_timeout`](crate::Builder::read_barrier_timeout)), then
/// looks the key up again. Dropping it (the follower stopped) ends the
/// waits; once the guard's last reader is gone, its filter no longer
/// follows the table, and would-be refusals go on to the handler until a
/// reader joins again.
///
/// # Example
///
/// A reader loop: mark the start before the read's snapshot is taken, put
/// the keys in the filter, then mark the read done.
///
/// ```
/// use bloom_guard::{BloomGuard, KeyBatch};
///
/// # async fn read_feed() -> KeyBatch { KeyBatch::default() }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = BloomGuard::builder().build();
/// let reader = guard.feed_reader();
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
    id: u64,
    asked: Arc<Notify>,
    /// The guard it reads for, to register its catch-up with.
    shared: Option<Arc<Shared>>,
}

/// The start of one feed read, from [`FeedReader::begin`].
#[derive(Debug, Clone, Copy)]
#[must_use = "hand it to FeedReader::done once the read's keys are in the filter"]
pub struct ReadStart(Instant);

impl FeedReader {
    pub(crate) fn new(barrier: Arc<Barrier>) -> Self {
        let (id, asked) = barrier.join();
        Self {
            barrier,
            id,
            asked,
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
            shared.add_catch_up(self.id, Arc::new(catch_up));
        }
    }

    /// Completes when a refusal waits for a read (at once if one asked
    /// since the last call): read the feed then.
    pub async fn asked(&self) {
        self.asked.notified().await;
    }

    /// Marks the start of a read. Call it before the read takes its
    /// snapshot or position: the read then sees every row committed
    /// before.
    pub fn begin(&self) -> ReadStart {
        ReadStart(Instant::now())
    }

    /// Marks the read that began at `start` done: its keys are in the
    /// filter. Once every reader of the guard has done a read that began
    /// after a request arrived, that request's refusal goes on.
    pub fn done(&self, start: ReadStart) {
        self.barrier.done(self.id, start.0);
    }

    /// Marks a read failed (the database unreachable): until a read is
    /// [`done`](Self::done), would-be refusals go on to the handler at
    /// once instead of waiting out the bound for a read that cannot come.
    pub fn failed(&self) {
        self.barrier.failed(self.id);
    }
}

impl Drop for FeedReader {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.remove_catch_up(self.id);
        }
        self.barrier.leave(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_read_that_began_before_the_request_does_not_pass_the_barrier() {
        let barrier = Arc::new(Barrier::new(Some(Duration::from_millis(100))));
        let reader = FeedReader::new(Arc::clone(&barrier));
        let early = reader.begin();
        tokio::time::advance(Duration::from_millis(1)).await;
        let arrived = Instant::now();
        let wait = tokio::spawn({
            let barrier = Arc::clone(&barrier);
            async move { barrier.wait_past(arrived).await }
        });
        tokio::task::yield_now().await;
        // The early read finishes after the request arrived: not enough.
        reader.done(early);
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        tokio::time::advance(Duration::from_millis(1)).await;
        let late = reader.begin();
        reader.done(late);
        assert!(wait.await.expect("the wait runs"));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_read_the_wait_gives_up_at_the_bound() {
        let barrier = Arc::new(Barrier::new(Some(Duration::from_millis(100))));
        let _reader = FeedReader::new(Arc::clone(&barrier));
        let arrived = Instant::now();
        let started = Instant::now();
        assert!(!barrier.wait_past(arrived).await);
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_failed_read_refusals_go_on_at_once_until_one_succeeds() {
        let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(1))));
        let reader = FeedReader::new(Arc::clone(&barrier));
        reader.failed();
        let started = Instant::now();
        assert!(!barrier.wait_past(Instant::now()).await);
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "waited for a read that cannot come"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        reader.done(reader.begin());
        assert!(barrier.wait_past(arrived).await);
    }

    #[tokio::test(start_paused = true)]
    async fn with_two_followers_a_refusal_waits_for_a_read_of_each() {
        let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(1))));
        let (items, orders) = (
            FeedReader::new(Arc::clone(&barrier)),
            FeedReader::new(Arc::clone(&barrier)),
        );
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let wait = tokio::spawn({
            let barrier = Arc::clone(&barrier);
            async move { barrier.wait_past(arrived).await }
        });
        // Both were asked.
        items.asked().await;
        orders.asked().await;
        items.done(items.begin());
        tokio::task::yield_now().await;
        assert!(
            !wait.is_finished(),
            "one follower's read proved the other's table"
        );
        orders.done(orders.begin());
        assert!(wait.await.expect("the wait runs"));
        // A follower that stops no longer holds refusals back.
        drop(orders);
        tokio::time::advance(Duration::from_millis(1)).await;
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        items.done(items.begin());
        assert!(barrier.wait_past(arrived).await);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_ask_the_reader_once_per_read() {
        let barrier = Arc::new(Barrier::new(Some(Duration::from_secs(1))));
        let reader = FeedReader::new(Arc::clone(&barrier));
        assert!(barrier.active());
        let arrived = Instant::now();
        let waits: Vec<_> = (0..100)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move { barrier.wait_past(arrived).await })
            })
            .collect();
        // Let every wait start and ask.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // Every ask so far is one permit: one read serves them all.
        reader.asked().await;
        tokio::time::advance(Duration::from_millis(1)).await;
        reader.done(reader.begin());
        for wait in waits {
            assert!(wait.await.expect("the wait runs"));
        }
        let no_more = tokio::time::timeout(Duration::from_millis(10), reader.asked()).await;
        assert!(no_more.is_err(), "a second read was asked for");
        drop(reader);
        // The filter follows the table no more: refusals go on at once.
        assert!(barrier.active());
        let started = Instant::now();
        assert!(!barrier.wait_past(Instant::now()).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
        // A reader that joins again takes the waits back.
        let again = FeedReader::new(Arc::clone(&barrier));
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        again.done(again.begin());
        assert!(barrier.wait_past(arrived).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_that_never_had_a_reader_has_no_barrier() {
        let barrier = Barrier::new(Some(Duration::from_secs(1)));
        assert!(!barrier.active());
    }
}
