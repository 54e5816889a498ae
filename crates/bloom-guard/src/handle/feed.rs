//! [`FeedHandle`]: what a change feed needs from a guard, apart from the
//! user's [`BloomGuard`].

use std::fmt;
use std::sync::Arc;

use crate::handle::guard::{BloomGuard, FailOpen};
use crate::keys::batch::KeyBatch;
use crate::lifecycle::barrier::FeedReader;
use crate::report::stats::{FeedStatus, FeedStorage};

/// A place in a change feed, in the feed's own notation: a transaction
/// snapshot, a row id, a log position. The guard compares positions only
/// for equality (a read that begins where the last one ended), so any
/// text that names one place of one feed will do.
///
/// ```
/// use bloom_guard::feed::Position;
///
/// let reached = Position::new("740:752:741,744");
/// assert_eq!(reached.as_str(), "740:752:741,744");
/// assert_eq!(reached, Position::from("740:752:741,744"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position(String);

impl Position {
    /// The position written as `position`.
    pub fn new(position: impl Into<String>) -> Self {
        Self(position.into())
    }

    /// The position as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Position {
    fn from(position: &str) -> Self {
        Self::new(position)
    }
}

impl From<String> for Position {
    fn from(position: String) -> Self {
        Self(position)
    }
}

impl BloomGuard {
    /// The guard as a change feed sees it: the reads it applies, the read
    /// barrier, rebuilds, snapshots and the fleet (see [`FeedHandle`]). For
    /// the authors of feeds; an application never needs it.
    pub fn feed(&self) -> FeedHandle<'_> {
        FeedHandle { guard: self }
    }
}

/// A guard as a change feed sees it: the reads it applies, the barrier it
/// keeps, the rebuilds, snapshots and fleet it takes part in. From
/// [`BloomGuard::feed`]; for the authors of feeds, such as
/// `bloom-guard-sqlx`'s followers. An application never needs it.
///
/// ```
/// use bloom_guard::feed::Position;
/// use bloom_guard::keys::KeyBatch;
/// use bloom_guard::{BloomGuard, KeyList};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), bloom_guard::BuildError> {
/// let guard = BloomGuard::builder().build();
/// let feed = guard.feed();
/// let _reads = feed.reader(); // a counting filter from here on
/// guard.rebuild(&KeyList::new(["a"])).await?;
/// let added: KeyBatch = ["b"].into_iter().collect();
/// feed.apply(&added, &KeyBatch::default(), Some(&Position::new("6")), Some(&Position::new("7")));
/// assert!(guard.may_contain("b"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct FeedHandle<'g> {
    pub(crate) guard: &'g BloomGuard,
}

impl<'g> FeedHandle<'g> {
    /// The feed's side of the read barrier (see [`FeedReader`]): while it
    /// lives, a key the filter would refuse waits for a feed read that
    /// began after its request arrived, then is looked up again. A feed
    /// takes one for as long as it reads; with
    /// [`read_barrier(false)`](crate::Builder::read_barrier) it changes
    /// nothing.
    ///
    /// From the first reader on, the guard counts as followed by a change
    /// feed: its builds make counting filters, which remove a key with its
    /// last row ([`apply`](Self::apply)), and the keys of its write path
    /// ([`BloomGuard::insert`]) are found for the write window and from
    /// then on through the feed.
    pub fn reader(self) -> FeedReader {
        FeedReader::of(Arc::clone(&self.guard.shared))
    }

    /// Applies a read of the change feed that began at `from` and reached
    /// `reached`: every added row's key (once per row) and every removed
    /// row's key, to the filter in use. A counting filter removes a key
    /// with the last of its rows, and only while it is sure it holds their
    /// inserts: it was built from a scan at a feed position and brought up
    /// to date by the feed's [`CatchUp`](crate::feed::CatchUp), and every
    /// read since began where the previous one ended (`from` is the
    /// position it stands at; a read from anywhere else, or from no known
    /// position, makes it keep deleted keys until the next rebuild). A
    /// Bloom filter takes the added keys only.
    ///
    /// Apply each read once, in order: a delete applied twice removes
    /// another key's fingerprint.
    pub fn apply(
        self,
        added: &KeyBatch,
        removed: &KeyBatch,
        from: Option<&Position>,
        reached: Option<&Position>,
    ) {
        self.guard.shared.apply_changes(
            added,
            removed,
            from.map(Position::as_str),
            reached.map(Position::as_str),
        );
    }

    /// Reports where the feed stands, for [`Stats::feed`](crate::Stats::feed).
    /// Called after each read.
    pub fn record_read(self, status: FeedStatus) {
        self.guard.shared.record_feed(status);
    }

    /// Reports the feed's room in the database and its pruning, for
    /// [`FeedStatus::storage`] and the metrics. Called after each prune,
    /// where the feed can tell.
    ///
    /// ```
    /// use bloom_guard::stats::{FeedStatus, FeedStorage};
    /// use bloom_guard::BloomGuard;
    ///
    /// let guard = BloomGuard::builder().build();
    /// guard.feed().record_read(FeedStatus::new("7", 0));
    /// guard.feed().record_storage(FeedStorage::new(8192, 0));
    /// let storage = guard.stats().feed.and_then(|feed| feed.storage);
    /// assert_eq!(storage, Some(FeedStorage::new(8192, 0)));
    /// ```
    pub fn record_storage(self, storage: FeedStorage) {
        self.guard.shared.record_feed_storage(storage);
    }

    /// As [`BloomGuard::fail_open`], saying why: [`Stats::reason`](crate::Stats::reason)
    /// and [`Stats::last_error`](crate::Stats::last_error) show `reason`
    /// while the hold lives (the reasons of every such hold, oldest first).
    /// For a gap in the feed, or a problem no rebuild fixes, such as a key
    /// type that does not compare keys as the database does. A guard held
    /// open from its start does not turn [ready](BloomGuard::is_ready)
    /// until the hold is dropped.
    ///
    /// ```
    /// use bloom_guard::stats::GuardState;
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder().build();
    /// guard.clone().warm(KeyList::new(["a"])).await;
    /// let hold = guard.feed().fail_open_because("use KeyType::CaseInsensitiveText");
    /// let stats = guard.stats();
    /// assert_eq!(stats.state, GuardState::Degraded);
    /// assert_eq!(stats.last_error.as_deref(), Some("use KeyType::CaseInsensitiveText"));
    /// drop(hold);
    /// assert_eq!(guard.stats().last_error, None);
    /// # }
    /// ```
    #[must_use = "the guard fails open only while the hold lives"]
    pub fn fail_open_because(self, reason: impl Into<String>) -> FailOpen {
        self.guard.fail_open_with(Some(reason.into()))
    }
}
