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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::filters::filter::Filter;
use crate::keys::key::Key;
use crate::lock::lock;

/// The longest the journal gets, whatever the write rate.
const CAPACITY: usize = 100_000;

#[derive(Debug, Default)]
struct Entries {
    order: VecDeque<(Instant, Box<[u8]>)>,
    counts: HashMap<Box<[u8]>, u32>,
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
            let Some((_, key)) = self.order.pop_front() else {
                break;
            };
            if let Some(count) = self.counts.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.counts.remove(&key);
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Journal {
    window: Duration,
    entries: Mutex<Entries>,
    /// Entries held, for a lookup's lock-free "empty" test.
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

    pub(crate) fn record(&self, key: &Key<'_>) {
        if self.window.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        let key: Box<[u8]> = key.as_bytes().into();
        *entries.counts.entry(key.clone()).or_insert(0) += 1;
        entries.order.push_back((now, key));
        entries.expire(now, self.window);
        self.len.store(entries.order.len(), Ordering::Release);
    }

    /// Whether the write path inserted `key` within the window.
    #[inline]
    pub(crate) fn contains(&self, key: &Key<'_>) -> bool {
        if self.len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        entries.expire(now, self.window);
        self.len.store(entries.order.len(), Ordering::Release);
        entries.counts.contains_key(key.as_bytes())
    }

    /// Inserts the keys recorded within the window into `filter` (a Bloom
    /// filter being built, which the write path also inserts into).
    pub(crate) fn replay(&self, filter: &Filter) {
        let now = Instant::now();
        for (at, key) in lock(&self.entries).order.iter().rev() {
            if now.duration_since(*at) > self.window {
                break;
            }
            filter.insert(&Key::from(&key[..]));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_within_the_window_and_forgotten_after() {
        let journal = Journal::new(Duration::from_millis(50));
        journal.record(&Key::from("a"));
        journal.record(&Key::from("a"));
        assert!(journal.contains(&Key::from("a")));
        assert!(!journal.contains(&Key::from("b")));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!journal.contains(&Key::from("a")));
        assert_eq!(journal.len(), 0);
    }
}
