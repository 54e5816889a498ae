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
//!
//! Waiting costs a request no lock, channel or timer of its own. Reads are
//! numbered: a request notes, per follower, the number of the next read
//! to begin (its [`Ticket`]) and waits until that read is done, one atomic
//! load per look. Every waiter of a guard sleeps on one [`Notify`], woken
//! once per finished read. One waiter at a time keeps the clock for all:
//! it wakes every `bound / 8` and moves a shared horizon, and every
//! request that arrived before `now - bound` goes on to the handler.

mod pace;
mod reader;
mod slot;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use pace::ReadPace;
pub use reader::{FeedReader, ReadStart};

use pace::nanos;
use slot::Slot;

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
    /// Bumped after every change of `readers`.
    generation: AtomicU64,
    next_id: AtomicU64,
    /// Whether a reader's last read failed: refusals go on at once,
    /// without waiting for a read that cannot come, until it succeeds.
    failing: AtomicBool,
    /// Every reader left (its follower stopped, or panicked in a hook):
    /// the filter no longer follows the table, so refusals go on at once
    /// until a reader joins again.
    orphaned: AtomicBool,
    /// Every waiter sleeps here; a finished read, a failure, a reader
    /// leaving or the clock wakes them all.
    released: Notify,
    /// Whether a waiter keeps the clock.
    keeping: AtomicBool,
    epoch: Instant,
    /// Nanoseconds after `epoch`: a request that arrived before it waited
    /// out the bound.
    horizon: AtomicU64,
}

/// What a request waits for: the first read to begin after it arrived, of
/// every follower.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// Nanoseconds after the barrier's epoch.
    arrived: u64,
    generation: u64,
    reads: Reads,
    /// Whether the followers were asked for the reads.
    asked: bool,
}

/// The read each follower owes a request, by slot id.
#[derive(Debug)]
enum Reads {
    None,
    One(u64, u64),
    Many(Vec<(u64, u64)>),
}

impl Reads {
    fn of(&self, id: u64) -> Option<u64> {
        match self {
            Self::None => None,
            Self::One(slot, read) => (*slot == id).then_some(*read),
            Self::Many(reads) => reads
                .iter()
                .find_map(|(slot, read)| (*slot == id).then_some(*read)),
        }
    }

    fn push(&mut self, id: u64, read: u64) {
        *self = match std::mem::replace(self, Self::None) {
            Self::None => Self::One(id, read),
            Self::One(slot, first) => Self::Many(vec![(slot, first), (id, read)]),
            Self::Many(mut reads) => {
                reads.push((id, read));
                Self::Many(reads)
            }
        };
    }
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
            generation: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            released: Notify::new(),
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
        let generation = self.generation.load(Ordering::Acquire);
        let mut reads = Reads::None;
        for slot in self.readers.load().iter() {
            reads.push(slot.id, slot.next_read());
        }
        Ticket {
            arrived: self.now(),
            generation,
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
    pub(crate) async fn wait(&self, mut ticket: Ticket) -> bool {
        if self.bound.is_none() {
            return false;
        }
        self.ask(&mut ticket);
        let mut keeper: Option<Keeper<'_>> = None;
        let mut next_tick = Instant::now() + self.tick;
        loop {
            // Made before the look: a wake-up between the two is not lost.
            let released = self.released.notified();
            tokio::pin!(released);
            match self.look(&mut ticket) {
                Look::Read => return true,
                Look::GoOn => return false,
                Look::Wait => {}
            }
            if ticket.arrived < self.horizon.load(Ordering::Acquire) {
                return false;
            }
            if keeper.is_none() {
                keeper = Keeper::claim(self);
            }
            if keeper.is_some() {
                tokio::select! {
                    () = &mut released => {}
                    () = tokio::time::sleep_until(next_tick) => {
                        next_tick = Instant::now() + self.tick;
                        self.move_horizon();
                    }
                }
            } else {
                released.await;
            }
        }
    }

    /// Whether every follower has done the read `ticket` owes; asks a
    /// follower that joined since the ticket was taken.
    fn look(&self, ticket: &mut Ticket) -> Look {
        if self.failing.load(Ordering::Acquire) || self.orphaned.load(Ordering::Acquire) {
            return Look::GoOn;
        }
        let readers = self.readers.load();
        if readers.is_empty() {
            return Look::GoOn;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if generation != ticket.generation {
            ticket.generation = generation;
            for slot in readers.iter() {
                if ticket.reads.of(slot.id).is_none() {
                    ticket.reads.push(slot.id, slot.next_read());
                    slot.ask();
                }
            }
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

    /// Every request that arrived more than the bound ago goes on.
    fn move_horizon(&self) {
        let bound = self.bound.unwrap_or_default();
        let horizon = self.now().saturating_sub(nanos(bound));
        self.horizon.fetch_max(horizon, Ordering::AcqRel);
        self.released.notify_waiters();
    }

    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    fn join(&self) -> Arc<Slot> {
        let slot = Arc::new(Slot::new(self.next_id.fetch_add(1, Ordering::Relaxed)));
        self.readers.rcu(|readers| {
            let mut readers = Vec::clone(readers);
            readers.push(Arc::clone(&slot));
            readers
        });
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.orphaned.store(false, Ordering::Release);
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
        self.generation.fetch_add(1, Ordering::AcqRel);
        if before.iter().all(|slot| slot.id == id) {
            self.orphaned.store(true, Ordering::Release);
            tracing::info!("the guard's change feed readers stopped; would-be refusals go to the handler from now on");
        }
        self.refresh_failing();
    }

    /// A reader's read finished or failed.
    fn refresh_failing(&self) {
        let failing = self
            .readers
            .load()
            .iter()
            .any(|slot| slot.failing.load(Ordering::Acquire));
        self.failing.store(failing, Ordering::Release);
        self.released.notify_waiters();
    }
}

/// The waiter that keeps the clock; handing it back wakes the others, so
/// one of them takes it over.
struct Keeper<'a>(&'a Barrier);

impl<'a> Keeper<'a> {
    fn claim(barrier: &'a Barrier) -> Option<Self> {
        (!barrier.keeping.load(Ordering::Relaxed)
            && barrier
                .keeping
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok())
        .then_some(Self(barrier))
    }
}

impl Drop for Keeper<'_> {
    fn drop(&mut self) {
        self.0.keeping.store(false, Ordering::Release);
        self.0.released.notify_waiters();
    }
}
