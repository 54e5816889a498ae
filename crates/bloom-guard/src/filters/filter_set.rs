//! The filter in use and the filters being built, and the write path's
//! journal.
//!
//! Inserts take the read lock, registration and promotion the write lock:
//! once a filter is registered, every insert that started earlier has
//! finished and is in the journal, and no insert falls between a filter's
//! registration and its promotion.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use arc_swap::{ArcSwapOption, Guard};

use crate::filters::filter::Filter;
use crate::filters::journal::Journal;
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::lock::{read_lock, write_lock};

/// The filter in use, as [`FilterSet::current`] lends it.
pub(crate) type Current = Guard<Option<Arc<Filter>>>;

#[derive(Debug)]
pub(crate) struct FilterSet {
    current: ArcSwapOption<Filter>,
    building: RwLock<Vec<Arc<Filter>>>,
    journal: Journal,
}

impl FilterSet {
    pub(crate) fn new(write_window: Duration) -> Self {
        Self {
            current: ArcSwapOption::empty(),
            building: RwLock::new(Vec::new()),
            journal: Journal::new(write_window),
        }
    }

    /// The filter in use, if any.
    #[inline]
    pub(crate) fn current(&self) -> Current {
        self.current.load()
    }

    /// About how many keys the next filter must hold besides its source's:
    /// the distinct keys of the filter in use (estimated from its fill) and
    /// the journal that will be replayed into it.
    pub(crate) fn keys_to_carry(&self) -> u64 {
        let in_use = self.current().as_deref().map_or(0, Filter::estimated_keys);
        in_use.max(self.journal.len() as u64)
    }

    /// Records a key of this instance's write path in the journal (until
    /// the window ends or feed read `read` or a later one brings its row:
    /// see [`NEVER`](crate::filters::journal::NEVER)), and inserts it into
    /// every filter unless the guard follows a change feed (`fed`: its
    /// filters take each key from the feed, once per row); returns the
    /// filter in use.
    pub(crate) fn insert(&self, key: &Key<'_>, fed: bool, read: u64) -> Current {
        let building = read_lock(&self.building);
        let current = self.current();
        if !fed {
            if let Some(filter) = &*current {
                filter.insert(key);
            }
            for filter in building.iter() {
                filter.insert(key);
            }
        }
        self.journal.record(key, read);
        current
    }

    /// Whether the write path inserted `key` within the write window.
    #[inline]
    pub(crate) fn journaled(&self, key: &Key<'_>) -> bool {
        self.journal.contains(key)
    }

    /// Inserts committed keys (a change feed's) into the filter in use and
    /// the filters being built that take them: a read of the feed with no
    /// deletes and no position, by feed read `read`. Returns the filter in
    /// use. No journal: a build that starts later scans their rows.
    pub(crate) fn insert_batch(&self, batch: &KeyBatch, read: u64) -> Current {
        self.apply(batch, &KeyBatch::default(), (None, None), read)
    }

    /// Applies a read of the change feed that began at feed position
    /// `from` and reached `reached`, under the same lock as a promotion
    /// (so no filter put in use meanwhile misses it): a counting filter in
    /// use takes the added rows and, if it is exact at `from`, the removed
    /// ones; a Bloom filter in use and the filters being built that take
    /// live keys take the added keys. Returns the filter in use.
    ///
    /// `read` is the feed read that brought them: the write path's journal
    /// entries it can bring retire for the added keys, which the filter in
    /// use holds from now on (a later delete of the key is the feed's to
    /// apply, not the window's to hide).
    pub(crate) fn apply(
        &self,
        added: &KeyBatch,
        removed: &KeyBatch,
        (from, reached): (Option<&str>, Option<&str>),
        read: u64,
    ) -> Current {
        let building = read_lock(&self.building);
        let current = self.current();
        let mut hashes = Vec::new();
        match current.as_deref() {
            Some(Filter::Counting(counting)) => counting.apply(added, removed, from, reached),
            Some(filter) => filter.insert_batch(added, &mut hashes),
            None => {}
        }
        for filter in building.iter() {
            take_live(filter, added, &mut hashes);
        }
        if current.is_some() {
            self.journal.retire(added, removed, read);
        }
        current
    }

    /// Makes `filter` receive every insert from now on, plus the journal.
    pub(crate) fn register(&self, filter: &Arc<Filter>) {
        let mut building = write_lock(&self.building);
        if !filter.removes() {
            self.journal.replay(filter);
        }
        building.push(Arc::clone(filter));
    }

    pub(crate) fn unregister(&self, filter: &Arc<Filter>) {
        let mut building = write_lock(&self.building);
        building.retain(|f| !Arc::ptr_eq(f, filter));
    }

    /// Puts a registered filter in use. Swapping and unregistering happen
    /// under the write lock so no insert can fall between the two.
    pub(crate) fn promote(&self, filter: &Arc<Filter>) {
        let mut building = write_lock(&self.building);
        self.current.store(Some(Arc::clone(filter)));
        building.retain(|f| !Arc::ptr_eq(f, filter));
    }
}

/// Hands the feed's keys to a filter being built: a Bloom filter takes
/// them; a counting filter holds, takes or ignores them, as its scan's feed
/// position says (a key both scanned and taken would be a copy no delete
/// removes).
fn take_live(filter: &Filter, batch: &KeyBatch, hashes: &mut Vec<u64>) {
    match filter {
        Filter::Counting(counting) => counting.take_live(batch),
        Filter::Bloom(_) => filter.insert_batch(batch, hashes),
    }
}
