//! The read barrier: before the guard answers "absent", the filter must
//! hold every row committed before the request arrived. A follower proves
//! it with a feed read that began after the request arrived; refusals
//! waiting at one moment share one read.
//!
//! | file | what lives there |
//! |---|---|
//! | `slot.rs` | one follower's reads, numbered, and the refusals that asked |
//! | `reader.rs` | [`FeedReader`], the follower's side |
//! | `pace.rs` | [`ReadPace`], how often reads start while refusals wait |
//! | `ticket.rs` | [`Ticket`], the reads one request waits for |
//! | `lookup.rs` | [`KeyLookup`], a follower's look at its table instead of a read |
//!
//! Waiting costs a request no lock, channel or timer of its own. Reads are
//! numbered: a request notes, per follower, the number of the next read
//! to begin (its [`Ticket`]) and waits until that read is done, one atomic
//! load per look. Waiters sleep on one of two [`Notify`]s by their read's
//! parity, so a finished read wakes only the waiters it releases (those of
//! the next read sleep on the other). While anyone waits, one task keeps
//! the clock for all: every `bound / 8` it looks whether every follower
//! finished a read meanwhile; if one did not, it moves a shared horizon and
//! wakes everyone, and every request that arrived before `now - bound` goes
//! on to the handler.

mod lookup;
mod pace;
mod reader;
mod slot;
#[cfg(test)]
mod tests;
mod ticket;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use lookup::{KeyLookup, LookupError, LookupKey};
pub use pace::ReadPace;
pub use reader::{FeedReader, ReadStart};

pub(crate) use lookup::Lookups;
use pace::nanos;
use slot::Slot;
use ticket::Reads;
pub(crate) use ticket::Ticket;

/// The next reader's id, unique in the process: readers of different
/// guards that share reads rank by it.
static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

/// The barrier of one guard: its followers' slots. A guard may have
/// several followers (one per watched table): a refusal waits for a read
/// of every one.
#[derive(Debug)]
pub(crate) struct Barrier {
    /// How long a refusal waits for reads before it goes to the handler;
    /// `None`: the guard has no barrier.
    bound: Option<Duration>,
    /// How often the clock keeper looks at the horizon.
    tick: Duration,
    pace: ReadPace,
    readers: ArcSwap<Vec<Arc<Slot>>>,
    /// Every reader left (its follower stopped, or panicked in a hook):
    /// the filter no longer follows the table, so refusals go on at once
    /// until a reader joins again.
    orphaned: AtomicBool,
    /// Waiters sleep here by the parity of their read: a finished read
    /// wakes its own; a failure, a reader joining or leaving, or the clock
    /// wakes both.
    released: [Notify; 2],
    /// Requests waiting now: the clock runs while there are any.
    waiting: AtomicUsize,
    /// Whether the clock's task runs.
    keeping: AtomicBool,
    epoch: Instant,
    /// Nanoseconds after `epoch`: a request that arrived before it waited
    /// out the bound.
    horizon: AtomicU64,
}

/// What a look at the barrier found.
enum Look {
    /// Every follower's owed read is done.
    Read,
    /// No read can be trusted to come: go on.
    GoOn,
    Wait,
}

impl Barrier {
    pub(crate) fn new(bound: Option<Duration>, pace: ReadPace) -> Self {
        let tick = bound.map_or(Duration::ZERO, |bound| {
            (bound / 8).max(Duration::from_millis(1))
        });
        Self {
            bound,
            tick,
            pace,
            readers: ArcSwap::from_pointee(Vec::new()),
            orphaned: AtomicBool::new(false),
            released: [Notify::new(), Notify::new()],
            waiting: AtomicUsize::new(0),
            keeping: AtomicBool::new(false),
            epoch: Instant::now(),
            horizon: AtomicU64::new(0),
        }
    }

    /// Whether a refusal has a read to wait for, or must go on because
    /// the guard's followers stopped.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.bound.is_some()
            && (!self.readers.load().is_empty() || self.orphaned.load(Ordering::Acquire))
    }

    /// How many readers there are.
    pub(crate) fn readers(&self) -> usize {
        self.readers.load().len()
    }

    /// The first read that can bring the row of a key the write path
    /// inserts now, for its journal entry: the next read of the guard's one
    /// follower. [`NEVER`](crate::filters::journal::NEVER) without a
    /// barrier, or with no follower or several.
    ///
    /// Only the barrier makes early retirement safe: a read of another
    /// insert's row of the key (and its delete) may retire the entry before
    /// this instance's row commits, and then only a refusal that waits for
    /// a read begun after its request is sure to see that row.
    pub(crate) fn journal_read(&self) -> u64 {
        match (self.bound, self.readers.load().as_slice()) {
            (Some(_), [slot]) => slot.next_read(),
            _ => crate::filters::journal::NEVER,
        }
    }

    /// The read the guard's one follower has begun last (the one whose
    /// changes it applies now); 0 without a barrier, or with no follower or
    /// several, which retires no journal entry.
    pub(crate) fn read_in_progress(&self) -> u64 {
        match (self.bound, self.readers.load().as_slice()) {
            (Some(_), [slot]) => slot.next_read() - 1,
            _ => 0,
        }
    }

    /// The lookups of every follower, when each has one: a would-be
    /// refusal then waits for their statements instead of feed reads.
    /// `None` without a barrier or a follower, or when one follower cannot
    /// look keys up.
    pub(crate) fn lookups(&self) -> Option<Vec<Arc<Lookups>>> {
        self.bound?;
        let readers = self.readers.load();
        if readers.is_empty() {
            return None;
        }
        readers.iter().map(|slot| slot.lookup.load_full()).collect()
    }

    /// Whether a table holds `key`, by every follower's lookup (see
    /// [`lookups`](Self::lookups)): `Some(false)` only if no table held it
    /// as of statements begun after this call; `None` if the answers did
    /// not all come within the bound (the database slow or gone), or at
    /// once while a follower's last lookup failed (its next statement,
    /// which this key joins, tells when they work again).
    pub(crate) async fn look_up(&self, lookups: Vec<Arc<Lookups>>, key: LookupKey) -> Option<bool> {
        let mut answers = Vec::with_capacity(lookups.len());
        let mut failing = false;
        for lookups in &lookups {
            let (answer, failed) = lookups.ask(key.clone());
            answers.push(answer);
            failing |= failed;
        }
        if failing {
            return None;
        }
        let all = async move {
            for answer in answers {
                // A lost answer (the lookup's task gone) counts as found.
                if answer.await.unwrap_or(true) {
                    return true;
                }
            }
            false
        };
        tokio::time::timeout(self.bound.unwrap_or_default(), all)
            .await
            .ok()
    }

    /// What a request arriving now waits for; asks every follower for a
    /// read.
    pub(crate) fn ticket(&self) -> Ticket {
        let mut ticket = self.note();
        self.ask(&mut ticket);
        ticket
    }

    /// What a request arriving now would wait for, without asking for the
    /// reads yet: [`wait`](Self::wait) asks.
    pub(crate) fn note(&self) -> Ticket {
        let mut reads = Reads::None;
        for slot in self.readers.load().iter() {
            reads.push(slot.id, slot.next_read());
        }
        Ticket {
            arrived: self.now(),
            reads,
            asked: false,
        }
    }

    fn ask(&self, ticket: &mut Ticket) {
        if !ticket.asked {
            ticket.asked = true;
            for slot in self.readers.load().iter() {
                slot.ask();
            }
        }
    }

    /// Waits until every follower has put in the filter the keys of a
    /// read that began after `ticket` was taken; `false` if that did not
    /// happen within the bound, or a follower's last read failed (the
    /// database is down or slow): then the filter may be stale, and the
    /// request must go on.
    pub(crate) async fn wait(self: &Arc<Self>, mut ticket: Ticket) -> bool {
        if self.bound.is_none() {
            return false;
        }
        self.ask(&mut ticket);
        let _waiting = Waiting::enter(self);
        loop {
            // The list this waiter's read is announced on; made before the
            // look: a wake-up between the two is not lost.
            let released = self.released[self.list_of(&mut ticket)].notified();
            match self.look(&ticket) {
                Look::Read => return true,
                Look::GoOn => return false,
                Look::Wait => {}
            }
            if ticket.arrived < self.horizon.load(Ordering::Acquire) {
                return false;
            }
            released.await;
        }
    }

    /// Which of the two lists announces the read `ticket` waits for: with
    /// one follower, its read's parity; with several, any finished read
    /// wakes both, so the first. Adds to the ticket the followers that
    /// joined since it was taken (any read of theirs from now on began
    /// after the request arrived), and asks them.
    fn list_of(&self, ticket: &mut Ticket) -> usize {
        let readers = self.readers.load();
        for slot in readers.iter() {
            if ticket.reads.of(slot.id).is_none() {
                ticket.reads.push(slot.id, slot.next_read());
                slot.ask();
            }
        }
        match readers.as_slice() {
            [slot] => ticket
                .reads
                .of(slot.id)
                .map_or(0, |read| usize::from(read % 2 == 1)),
            _ => 0,
        }
    }

    /// Whether every follower has done the read `ticket` owes. A follower
    /// the ticket does not name yet holds the wait until the next look
    /// adds it.
    fn look(&self, ticket: &Ticket) -> Look {
        if self.orphaned.load(Ordering::Acquire) {
            return Look::GoOn;
        }
        let readers = self.readers.load();
        if readers.is_empty() {
            return Look::GoOn;
        }
        // A follower whose last read failed cannot bring the read soon.
        if readers
            .iter()
            .any(|slot| slot.failing.load(Ordering::Acquire))
        {
            return Look::GoOn;
        }
        let all = readers.iter().all(|slot| {
            ticket
                .reads
                .of(slot.id)
                .is_some_and(|read| slot.has_done(read))
        });
        if all {
            Look::Read
        } else {
            Look::Wait
        }
    }

    /// Keeps the clock while anyone waits: every tick, if a follower
    /// finished no read since the last, every request that arrived more
    /// than the bound ago goes on. Runs on the waiters' runtime; a runtime
    /// that stops drops it, and the next waiter starts another.
    async fn keep_time(self: Arc<Self>) {
        /// Hands the clock back if the task is dropped (its runtime
        /// stopped): the next waiter starts another.
        struct Keeping<'a>(Option<&'a AtomicBool>);
        impl Drop for Keeping<'_> {
            fn drop(&mut self) {
                if let Some(keeping) = self.0 {
                    keeping.store(false, Ordering::SeqCst);
                }
            }
        }
        let mut keeping = Keeping(Some(&self.keeping));
        let bound = self.bound.unwrap_or_default();
        let mut seen: Vec<(u64, u64)> = Vec::new();
        loop {
            tokio::time::sleep(self.tick).await;
            if self.waiting.load(Ordering::SeqCst) == 0 {
                // Hand the clock back, then look again: a waiter that came
                // meanwhile found it taken and started none.
                self.keeping.store(false, Ordering::SeqCst);
                if self.waiting.load(Ordering::SeqCst) == 0
                    || self
                        .keeping
                        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                        .is_err()
                {
                    keeping.0 = None;
                    return;
                }
            }
            let readers = self.readers.load();
            let stalled = readers.iter().any(|slot| {
                let done = slot.reads_done();
                let before = seen
                    .iter()
                    .find(|(id, _)| *id == slot.id)
                    .map(|(_, done)| *done);
                before.is_none_or(|before| before == done)
            });
            seen = readers
                .iter()
                .map(|slot| (slot.id, slot.reads_done()))
                .collect();
            if stalled {
                let horizon = self.now().saturating_sub(nanos(bound));
                self.horizon.fetch_max(horizon, Ordering::AcqRel);
                self.wake_all();
            }
        }
    }

    /// Read `read` of a follower is done; the highest done before was
    /// `before`. Wakes the waiters it releases.
    fn read_done(&self, before: u64, read: u64) {
        if read == before + 1 && self.readers.load().len() == 1 {
            self.released[usize::from(read % 2 == 1)].notify_waiters();
        } else {
            self.wake_all();
        }
    }

    pub(super) fn wake_all(&self) {
        for released in &self.released {
            released.notify_waiters();
        }
    }

    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    fn join(&self) -> Arc<Slot> {
        let slot = Arc::new(Slot::new(NEXT_SLOT.fetch_add(1, Ordering::Relaxed)));
        self.readers.rcu(|readers| {
            let mut readers = Vec::clone(readers);
            readers.push(Arc::clone(&slot));
            readers
        });
        self.orphaned.store(false, Ordering::Release);
        self.wake_all();
        slot
    }

    fn leave(&self, id: u64) {
        let before = self.readers.rcu(|readers| {
            readers
                .iter()
                .filter(|slot| slot.id != id)
                .cloned()
                .collect::<Vec<_>>()
        });
        if before.iter().all(|slot| slot.id == id) {
            self.orphaned.store(true, Ordering::Release);
            tracing::info!("the guard's change feed readers stopped; would-be refusals go to the handler from now on");
        }
        self.wake_all();
    }
}

/// A request counted as waiting, for as long as it waits; the first starts
/// the clock.
struct Waiting<'a>(&'a Barrier);

impl<'a> Waiting<'a> {
    fn enter(barrier: &'a Arc<Barrier>) -> Self {
        barrier.waiting.fetch_add(1, Ordering::SeqCst);
        if !barrier.keeping.load(Ordering::SeqCst)
            && barrier
                .keeping
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(Arc::clone(barrier).keep_time());
                }
                Err(_) => barrier.keeping.store(false, Ordering::Release),
            }
        }
        Self(barrier)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}
