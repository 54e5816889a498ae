//! The keys this instance's write path inserted lately.
//!
//! A key inserted before a build registers its filter, whose row commits
//! after the build's scan took its snapshot, is in neither: the change feed
//! brings it a moment after the commit, but this instance promised its
//! writer that the key is found as soon as the write returns. Lookups
//! consult the journal when the filter says "absent", so that promise
//! holds for writes that take less than the window, whatever filter is in
//! use. A guard that follows a change feed puts its write path's keys only
//! here: a counting filter takes each key from the feed, once per row, and
//! a key of a transaction that rolled back is forgotten with its entry.
//!
//! With a read barrier, an entry retires early when a feed read that began
//! after it brings a row of its key and not that row's delete (the guard's
//! one follower numbers its reads): the filter holds the key from then on,
//! and a delete the feed brings later is honoured at once instead of
//! hidden for the rest of the window. A read that began before the entry
//! may bring another insert's row of the same key, so it retires nothing.
//! The row read may still be another client's; then this instance's own
//! row comes in a later read, which a refusal waits for under the barrier.
//! Without a barrier nothing but the window retires an entry. A
//! rolled-back insert brings no row: its entry lasts the window.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::filters::filter::Filter;
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::lock::lock;

/// The longest the journal gets, whatever the write rate.
const CAPACITY: usize = 100_000;

/// A journal entry's feed read: the first read of the guard's one follower
/// that can bring the entry's row. `NEVER`: no single follower (none, or
/// several), the entry lasts the window.
pub(crate) const NEVER: u64 = u64::MAX;

#[derive(Debug, Default)]
struct Entries {
    /// Every entry by age, for the window; retired ones too.
    order: VecDeque<(Instant, Box<[u8]>)>,
    /// The entries still in force, per key: when, and their read.
    live: HashMap<Box<[u8]>, VecDeque<(Instant, u64)>>,
    /// Entries in `live`.
    len: usize,
}

impl Entries {
    /// Forgets the entries older than `window`, and the oldest past the
    /// capacity.
    fn expire(&mut self, now: Instant, window: Duration) {
        while self.order.len() > CAPACITY
            || self
                .order
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > window)
        {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            // A retired entry left `live` already: entries retire oldest
            // first, so the one leaving by age, if live, is its key's first.
            if let Some(entries) = self.live.get_mut(&key) {
                if entries.front().is_some_and(|(first, _)| *first == at) {
                    entries.pop_front();
                    self.len -= 1;
                }
                if entries.is_empty() {
                    self.live.remove(&key);
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Journal {
    window: Duration,
    entries: Mutex<Entries>,
    /// Entries in force, for a lookup's lock-free "empty" test.
    len: AtomicUsize,
}

impl Journal {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            entries: Mutex::default(),
            len: AtomicUsize::new(0),
        }
    }

    /// Records `key`, whose row the feed can bring from read `read` on
    /// ([`NEVER`]: only the window retires it).
    pub(crate) fn record(&self, key: &Key<'_>, read: u64) {
        if self.window.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        let key: Box<[u8]> = key.as_bytes().into();
        entries
            .live
            .entry(key.clone())
            .or_default()
            .push_back((now, read));
        entries.len += 1;
        entries.order.push_back((now, key));
        entries.expire(now, self.window);
        self.len.store(entries.len, Ordering::Release);
    }

    /// Feed read `read` brought a row of each of `added`, and took one of
    /// each of `removed`: the entries of the added keys that this read can
    /// bring retire (the filter holds the key now, and a later delete is
    /// the feed's to apply). A key the same read also removed keeps its
    /// entries: the row may have been another client's, inserted and
    /// deleted. Entries recorded after the read began stay: their rows
    /// come in a later read.
    pub(crate) fn retire(&self, added: &KeyBatch, removed: &KeyBatch, read: u64) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let removed: HashSet<Key<'_>> = removed.iter().collect();
        let mut entries = lock(&self.entries);
        for key in added.iter() {
            if removed.contains(&key) {
                continue;
            }
            let key = key.as_bytes();
            let Some(live) = entries.live.get_mut(key) else {
                continue;
            };
            let before = live.len();
            live.retain(|(_, first_read)| *first_read > read);
            let retired = before - live.len();
            if live.is_empty() {
                entries.live.remove(key);
            }
            entries.len -= retired;
        }
        self.len.store(entries.len, Ordering::Release);
    }

    /// Whether the write path inserted `key` within the window, and no
    /// feed read has brought its row since.
    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        if self.len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        entries.expire(now, self.window);
        self.len.store(entries.len, Ordering::Release);
        entries.live.contains_key(key.as_bytes())
    }

    /// Inserts the keys recorded within the window into `filter` (a Bloom
    /// filter being built, which the write path also inserts into).
    pub(crate) fn replay(&self, filter: &Filter) {
        let now = Instant::now();
        for (key, live) in &lock(&self.entries).live {
            if live
                .iter()
                .any(|(at, _)| now.duration_since(*at) <= self.window)
            {
                filter.insert(&Key::from(&key[..]));
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(key: &str) -> KeyBatch {
        [key].into_iter().collect()
    }

    impl Journal {
        fn retire_added(&self, added: &KeyBatch, read: u64) {
            self.retire(added, &KeyBatch::default(), read);
        }
    }

    #[test]
    fn a_key_is_found_within_the_window_and_forgotten_after() {
        let journal = Journal::new(Duration::from_millis(50));
        journal.record(&Key::from("a"), NEVER);
        journal.record(&Key::from("a"), NEVER);
        assert!(journal.contains(&Key::from("a")));
        assert!(!journal.contains(&Key::from("b")));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!journal.contains(&Key::from("a")));
        assert_eq!(journal.len(), 0);
    }

    #[test]
    fn an_entry_retires_with_a_read_that_began_after_it_and_brought_its_key() {
        let journal = Journal::new(Duration::from_secs(60));
        journal.record(&Key::from("a"), 3);
        journal.record(&Key::from("b"), 3);
        // Read 2 began before the entries: its row of "a" is another's.
        journal.retire_added(&batch("a"), 2);
        assert!(journal.contains(&Key::from("a")));
        // Read 3 brought "a", not "b".
        journal.retire_added(&batch("a"), 3);
        assert!(!journal.contains(&Key::from("a")));
        assert!(journal.contains(&Key::from("b")));
        assert_eq!(journal.len(), 1);
        // Inserted again: a new entry, for a later read.
        journal.record(&Key::from("a"), 5);
        journal.retire_added(&batch("a"), 4);
        assert!(journal.contains(&Key::from("a")));
        // Entries that no single read can bring last the window.
        journal.record(&Key::from("c"), NEVER);
        journal.retire_added(&batch("c"), 1_000);
        assert!(journal.contains(&Key::from("c")));
    }

    #[test]
    fn retired_entries_leave_the_window_without_taking_live_ones() {
        let journal = Journal::new(Duration::from_millis(50));
        journal.record(&Key::from("a"), 1);
        journal.retire_added(&batch("a"), 1);
        std::thread::sleep(Duration::from_millis(30));
        journal.record(&Key::from("a"), 2);
        std::thread::sleep(Duration::from_millis(30));
        // The first entry left by age; the second, live, stays.
        assert!(journal.contains(&Key::from("a")));
        assert_eq!(journal.len(), 1);
        std::thread::sleep(Duration::from_millis(30));
        assert!(!journal.contains(&Key::from("a")));
        assert_eq!(journal.len(), 0);
    }
}
