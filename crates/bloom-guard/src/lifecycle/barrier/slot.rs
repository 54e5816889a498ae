//! One follower's standing with the barrier: its reads, numbered, and the
//! refusals that asked for one. Atomics only: the request path reads and
//! asks without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use super::lookup::Lookups;

/// A reader's reads and asks, shared by the reader and every waiter.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) id: u64,
    /// Reads begun: read `n` is the `n`-th. A request that saw `begun ==
    /// n` waits for read `n + 1`, which begins after it looked.
    begun: AtomicU64,
    /// The highest read whose keys are in the filter.
    done: AtomicU64,
    /// Its last read failed.
    pub(super) failing: AtomicBool,
    /// A refusal asked since the last read began: later ones need not
    /// wake the reader again.
    asked: AtomicBool,
    /// Refusals that asked, ever: the reader paces its reads by them.
    asks: AtomicU64,
    /// The ask count at which a pacing reader has company enough.
    enough_at: AtomicU64,
    /// Wakes the reader: the first ask since a read began, and the ask
    /// that makes company enough.
    pub(super) wake: Notify,
    /// How the follower looks keys up in its table, if it can.
    pub(super) lookup: ArcSwapOption<Lookups>,
}

impl Slot {
    pub(super) fn new(id: u64) -> Self {
        Self {
            id,
            begun: AtomicU64::new(0),
            done: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            asked: AtomicBool::new(false),
            asks: AtomicU64::new(0),
            enough_at: AtomicU64::new(u64::MAX),
            wake: Notify::new(),
            lookup: ArcSwapOption::empty(),
        }
    }

    /// The number of the first read to begin from now on.
    ///
    /// Every read numbered so far may have taken its snapshot before the
    /// caller looked; the next one begins after. `begun` and `asked` are
    /// sequentially consistent with [`begin`](Self::begin)'s writes: a
    /// request that finds `asked` already set looked before the read that
    /// will clear it began, so that read serves it.
    pub(super) fn next_read(&self) -> u64 {
        self.begun.load(Ordering::SeqCst) + 1
    }

    /// Asks the reader for a read: wakes it for the first ask since a
    /// read began, and for the one that makes company enough.
    pub(super) fn ask(&self) {
        let asks = self.asks.fetch_add(1, Ordering::Relaxed) + 1;
        let first = !self.asked.load(Ordering::SeqCst) && !self.asked.swap(true, Ordering::SeqCst);
        if first || asks == self.enough_at.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Whether read `read` (or a later one) is done.
    pub(super) fn has_done(&self, read: u64) -> bool {
        self.done.load(Ordering::Acquire) >= read
    }

    /// Numbers a new read; for a read refusals asked for, `per_read` asks
    /// from now on make company enough for the next such read. Returns the read's number and the asks so
    /// far.
    pub(super) fn begin(&self, per_read: Option<u64>) -> (u64, u64) {
        self.asked.store(false, Ordering::SeqCst);
        let read = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        let asks = self.asks.load(Ordering::Relaxed);
        if let Some(per_read) = per_read {
            self.enough_at
                .store(asks.saturating_add(per_read), Ordering::Relaxed);
        }
        (read, asks)
    }

    /// Read `read`'s keys are in the filter; the highest read done before.
    pub(super) fn done(&self, read: u64) -> u64 {
        self.failing.store(false, Ordering::Release);
        self.done.fetch_max(read, Ordering::AcqRel)
    }

    /// The highest read done.
    pub(super) fn reads_done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }

    /// Whether a refusal asked since the last read began.
    pub(super) fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    /// Refusals that asked since `asks_at_begin`.
    pub(super) fn asks_since(&self, asks_at_begin: u64) -> u64 {
        self.asks
            .load(Ordering::Relaxed)
            .saturating_sub(asks_at_begin)
    }
}
