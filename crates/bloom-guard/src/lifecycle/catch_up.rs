//! Bringing a new counting filter up to date from the change feed before
//! it goes in use, so that every delete is applied to it exactly once.
//!
//! A counting filter removes a key's fingerprint for each deleted row; one
//! removed for a row it never held would take another key's with it. So a
//! build that scanned at a feed position hands its filter to the guard's
//! follower ([`CatchUp`]), which reads the feed from exactly that position
//! into it and puts it in use with no read applied to the filter in use in
//! between: no change is applied twice, none is missed.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::error::BuildError;
use crate::filters::filter::Filter;
use crate::keys::batch::KeyBatch;
use crate::keys::key_type::KeyType;
use crate::report::stats::FilterOrigin;

/// What puts a pending filter in use: the guard's state.
pub(crate) trait Promote: Send + Sync {
    /// Puts `filter` in use, unless its estimated rate is above the bound;
    /// its generation.
    fn promote_pending(
        &self,
        filter: &Arc<Filter>,
        origin: FilterOrigin,
    ) -> Result<u64, BuildError>;
}

/// The follower side of a build: brings a [`PendingFilter`] up to date
/// from the change feed and puts it in use.
///
/// Registered with [`FeedReader::catch_up_with`](crate::feed::FeedReader::catch_up_with)
/// by the one follower of a guard. Its reads of the feed and its applying
/// them must be one sequence with the follower's own reads: a read applied
/// to the filter in use after the pending filter's read began, and before
/// its promotion, would be lost to it.
///
/// # Example
///
/// A follower whose feed is a list of changes in memory, read from a
/// position that counts them.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use bloom_guard::{BloomGuard, BuildError, feed::{CatchUp, PendingFilter}, keys::KeyBatch, KeySource};
/// use futures_util::future::BoxFuture;
/// use futures_util::stream::{self, BoxStream, StreamExt};
///
/// /// Rows as (key, added?), in commit order.
/// #[derive(Clone, Default)]
/// struct Feed(Arc<Mutex<Vec<(String, bool)>>>);
///
/// impl Feed {
///     /// The changes after `position`, and the position after them.
///     fn read(&self, position: usize) -> (KeyBatch, KeyBatch, usize) {
///         let rows = self.0.lock().unwrap();
///         let (mut added, mut removed) = (KeyBatch::default(), KeyBatch::default());
///         for (key, add) in &rows[position..] {
///             if *add { added.push(key.as_bytes()) } else { removed.push(key.as_bytes()) }
///         }
///         (added, removed, rows.len())
///     }
/// }
///
/// impl CatchUp for Feed {
///     fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>> {
///         Box::pin(async move {
///             let from = pending.position().parse().unwrap_or(0);
///             let (added, removed, reached) = self.read(from);
///             pending.apply(&added, &removed, &reached.to_string());
///             pending.promote()
///         })
///     }
/// }
///
/// /// The table as the feed left it, scanned at its position.
/// impl KeySource for Feed {
///     type Error = std::convert::Infallible;
///     async fn count_hint(&self) -> Result<Option<u64>, Self::Error> { Ok(None) }
///     fn keys(&self) -> BoxStream<'static, Result<KeyBatch, Self::Error>> {
///         let rows = self.0.lock().unwrap();
///         let mut live: Vec<String> = Vec::new();
///         for (key, add) in rows.iter() {
///             if *add { live.push(key.clone()) } else if let Some(i) = live.iter().position(|k| k == key) { live.remove(i); }
///         }
///         let mut batch: KeyBatch = live.iter().collect();
///         batch.set_position(rows.len().to_string());
///         stream::iter([Ok(batch)]).boxed()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BuildError> {
/// let feed = Feed::default();
/// feed.0.lock().unwrap().extend([("a".into(), true), ("b".into(), true)]);
/// let guard = BloomGuard::builder().read_barrier(false).build();
/// let reader = guard.feed().reader();
/// reader.catch_up_with(feed.clone());
/// guard.rebuild(&feed).await?;
///
/// // "a" deleted: the follower applies its read.
/// feed.0.lock().unwrap().push(("a".into(), false));
/// let (added, removed, _) = feed.read(2);
/// guard.feed().apply(&added, &removed, Some(&"2".into()), Some(&"3".into()));
/// assert!(!guard.may_contain("a") && guard.may_contain("b"));
/// # Ok(()) }
/// ```
pub trait CatchUp: Send + Sync + 'static {
    /// Reads the feed from the pending filter's
    /// [`position`](PendingFilter::position), applies what it read with
    /// [`PendingFilter::apply`], and puts it in use with
    /// [`PendingFilter::promote`], whose generation it returns.
    fn catch_up(&self, pending: PendingFilter) -> BoxFuture<'_, Result<u64, BuildError>>;
}

/// A counting filter built from a scan at a feed position, waiting for
/// the follower to apply the feed since and put it in use.
pub struct PendingFilter {
    guard: Arc<dyn Promote>,
    key_type: KeyType,
    filter: Arc<Filter>,
    position: String,
    origin: FilterOrigin,
}

impl std::fmt::Debug for PendingFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFilter")
            .field("position", &self.position)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl PendingFilter {
    pub(crate) fn new(
        guard: Arc<dyn Promote>,
        key_type: KeyType,
        filter: Arc<Filter>,
        position: String,
        origin: FilterOrigin,
    ) -> Self {
        Self {
            guard,
            key_type,
            filter,
            position,
            origin,
        }
    }

    /// The feed position of its scan: it holds every change committed
    /// before, none after.
    pub fn position(&self) -> &str {
        &self.position
    }

    /// Applies a read of the feed from [`position`](Self::position) (or
    /// from where the previous `apply` reached): the added rows' keys and
    /// the removed rows' keys, each once per row, and the position the
    /// read reached.
    pub fn apply(&self, added: &KeyBatch, removed: &KeyBatch, reached: &str) {
        let key_type = self.key_type;
        if let Some(counting) = self.filter.counting() {
            counting.apply(
                &key_type.canonical_batch(added),
                &key_type.canonical_batch(removed),
                None,
                Some(reached),
            );
        }
    }

    /// Puts the filter in use; its generation.
    ///
    /// # Errors
    ///
    /// [`BuildError::Overfull`] if its estimated false-positive rate is
    /// above the bound: the filter in use stays.
    pub fn promote(self) -> Result<u64, BuildError> {
        self.guard.promote_pending(&self.filter, self.origin)
    }
}
