//! The keys this instance's write path inserted lately, for the filters
//! whose build starts while those rows may still be committing.
//!
//! A key inserted before a build registers its filter, whose row commits
//! after the build's scan took its snapshot, is in neither: the change feed
//! brings it a moment after the commit, but this instance promised its
//! writer that the key is found as soon as the write returns. Replaying the
//! journal into each new filter keeps that promise for writes that take
//! less than the window.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::filters::filter::Filter;
use crate::keys::key::Key;
use crate::lock::lock;

/// The longest the journal gets, whatever the write rate.
const CAPACITY: usize = 100_000;

#[derive(Debug)]
pub(crate) struct Journal {
    window: Duration,
    entries: Mutex<VecDeque<(Instant, Box<[u8]>)>>,
}

impl Journal {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            entries: Mutex::default(),
        }
    }

    pub(crate) fn record(&self, key: &Key<'_>) {
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        entries.push_back((now, key.as_bytes().into()));
        while entries.len() > CAPACITY
            || entries
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > self.window)
        {
            entries.pop_front();
        }
    }

    /// Inserts the keys recorded within the window into `filter`.
    pub(crate) fn replay(&self, filter: &Filter) {
        let now = Instant::now();
        for (at, key) in lock(&self.entries).iter().rev() {
            if now.duration_since(*at) > self.window {
                break;
            }
            filter.insert(&Key::from(&key[..]));
        }
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).len()
    }
}
