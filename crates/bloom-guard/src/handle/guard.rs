//! The `BloomGuard` handle.

use std::sync::Arc;

use crate::handle::shared::Shared;
use crate::keys::batch::KeyBatch;
use crate::keys::key::Key;
use crate::keys::key_type::KeyType;
use crate::report::stats::Stats;
use crate::switches::mode::Mode;

/// A Bloom filter of every key of a database table, shared by the layers
/// that answer requests for keys it does not hold.
///
/// # The handle
///
/// `BloomGuard` is a cheap-to-clone handle (an `Arc` inside), the same type
/// for every guard: keep it in your application state to
/// [`insert`](Self::insert) keys as you write them, hand it to a follower
/// or [`warm`](Self::warm) to load the database's keys, and make a tower
/// [`Layer`] for each route with [`layer`](Self::layer), telling it where
/// the route's key is. All clones and layers share one filter.
///
/// # Failing open
///
/// Until the first filter is built the guard lets every request through, so
/// a cold start or a database outage never rejects a key that exists.
/// [`is_ready`](Self::is_ready) tells when the guard starts answering.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use bloom_guard::{BloomGuard, KeyList, extract::PathParam};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = BloomGuard::builder()
///     .expected_items(1_000_000)
///     .false_positive_rate(0.001)
///     .build();
/// tokio::spawn(guard.clone().warm(KeyList::new(["alice", "bob"])));
///
/// let app: Router = Router::new()
///     .route("/items/{key}", get(|| async { "found" }))
///     .route_layer(guard.layer(PathParam("key")));
///
/// guard.insert("carol"); // before the row commits
/// # }
/// ```
///
/// [`Layer`]: tower_layer::Layer
#[derive(Debug, Clone)]
pub struct BloomGuard {
    pub(crate) shared: Arc<Shared>,
}

impl BloomGuard {
    /// The mode the guard is in.
    pub fn mode(&self) -> Mode {
        self.shared.control.mode()
    }

    /// The share of would-be rejections that enforce mode passes on and
    /// checks (see [`Builder::audit_rate`](crate::Builder::audit_rate)).
    pub fn audit_rate(&self) -> f64 {
        self.shared.control.audit_rate()
    }

    /// The guard's name (see [`Builder::name`](crate::Builder::name)).
    pub fn name(&self) -> &'static str {
        self.shared.config.name
    }

    /// Waits until a filter is in place and the guard answers absent keys.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder().build();
    /// tokio::spawn(guard.clone().warm(KeyList::new(["a"])));
    /// guard.ready().await;
    /// assert!(!guard.may_contain("b"));
    /// # }
    /// ```
    pub async fn ready(&self) {
        self.shared.health.ready().await;
    }
    /// Adds a key to the filter: call it before the row holding the key
    /// commits.
    ///
    /// Inserting first means a failed write leaves only a harmless false
    /// positive, while inserting after the commit would leave a window in
    /// which this instance rejects its own new key. The key is remembered
    /// for a while (see [`Builder::write_window`](crate::Builder::write_window)),
    /// whatever filter is in use meanwhile. A guard without a change feed
    /// also puts it into its filter and any being built, for good. A guard
    /// with one (a [`FeedHandle::reader`](crate::feed::FeedHandle::reader)) does not: its
    /// counting filter takes the key from the feed once the row commits,
    /// once per row, so that the row's delete can remove it again, and a
    /// transaction that rolls back leaves nothing behind. Other instances
    /// learn the key from the change feed too.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder().build();
    /// guard.clone().warm(KeyList::new(["a"])).await;
    /// guard.insert("b");
    /// assert!(guard.may_contain("b"));
    /// # }
    /// ```
    pub fn insert(&self, key: impl AsRef<[u8]>) {
        self.shared.insert(&Key::from(key.as_ref()));
    }

    /// Adds a batch of keys (and its count of [skipped](KeyBatch::skip)
    /// keys), as a change feed reader does with what it read.
    pub fn insert_batch(&self, batch: &KeyBatch) {
        self.shared.insert_batch(batch);
    }

    /// Whether the key may exist: `false` means it certainly does not. The
    /// key is put in the guard's [`KeyType`](crate::KeyType) form first;
    /// one with characters the key type cannot compare as the database
    /// does (a combining mark under a collation) may be stored under
    /// another spelling: `true`. Always `true` while no filter is in place
    /// (the guard fails open).
    pub fn may_contain(&self, key: impl AsRef<[u8]>) -> bool {
        let key = Key::from(key.as_ref());
        let key_type = self.shared.config.key_type;
        match key_type.to_canonical(key.clone()) {
            Ok(canonical) => self.shared.may_contain(&canonical),
            Err(crate::keys::key::KeyError::Uncomparable) => true,
            // Not text, or not of the type: a stored key's own form (a key
            // the database weighed, an integer column's text).
            Err(_) => self.shared.may_contain(&key_type.canonical_or_same(key)),
        }
    }

    /// Whether the guard has protected: a filter that holds every key
    /// (no hold, no false negative seen), within its false-positive bound
    /// ([`Builder::rebuild_above`](crate::Builder::rebuild_above) × the
    /// target), was in use. Once true it stays true: a later degradation
    /// fails the guard open and shows in [`Stats::state`] and the metrics,
    /// for a readiness probe must not take a fleet out of rotation for a
    /// database blip.
    pub fn is_ready(&self) -> bool {
        self.shared.health.is_ready()
    }

    /// Reports a false positive: the guard let a key through and the
    /// database had nothing for it. [`Stats::observed_fpp`] compares these
    /// with the rejections, next to the estimate.
    ///
    /// Call it where the database answers "not found" for a key that went
    /// through the guard: inside a cache's load, not on a cache hit (a
    /// cached "not found" answered again is one false positive, not many).
    /// Reports made while the guard lets every request through are not
    /// counted.
    ///
    /// ```
    /// # #[cfg(feature = "cache")] {
    /// use bloom_guard::{BloomGuard, cache::ReadThroughCache};
    ///
    /// # async fn find(_: &str) -> Result<Option<String>, std::io::Error> { Ok(None) }
    /// # async fn handler(guard: BloomGuard, cache: ReadThroughCache<String, String>, key: String) {
    /// let value = cache
    ///     .get_or_load(key.clone(), || async {
    ///         let found = find(&key).await?;
    ///         if found.is_none() {
    ///             guard.record_false_positive();
    ///         }
    ///         Ok::<_, std::io::Error>(found)
    ///     })
    ///     .await;
    /// # let _ = value; }
    /// # }
    /// ```
    pub fn record_false_positive(&self) {
        self.shared.record_false_positive();
    }

    /// Reports a failure that keeps the first filter from being built, such
    /// as a database that refuses connections before warm-up can start: the
    /// state turns `degraded` (while no filter is in use) and
    /// [`Stats::last_error`] shows `error`. Log it yourself; the guard does
    /// not.
    pub fn report_unavailable(&self, error: &dyn std::error::Error) {
        self.shared.record_failure(crate::error::error_chain(error));
    }

    /// Lets every request through until the returned value is dropped,
    /// while a filter stays in use and keeps taking inserts.
    ///
    /// For when the filter may be missing keys for a while, such as a
    /// follower that lost notifications and is catching up. Holds nest:
    /// the guard answers absent keys again once all are dropped.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, KeyList, stats::GuardState};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = BloomGuard::builder().build();
    /// guard.clone().warm(KeyList::new(["a"])).await;
    /// let hold = guard.fail_open();
    /// assert!(guard.may_contain("b"));
    /// assert_eq!(guard.stats().state, GuardState::Degraded);
    /// drop(hold);
    /// assert!(!guard.may_contain("b"));
    /// # }
    /// ```
    #[must_use = "the guard fails open only while the hold lives"]
    pub fn fail_open(&self) -> FailOpen {
        self.fail_open_with(None)
    }

    /// A hold, with its reason if it has one.
    pub(crate) fn fail_open_with(&self, reason: Option<String>) -> FailOpen {
        let reason = reason.map(|reason| self.shared.health.add_hold_reason(reason));
        self.shared.hold_open();
        FailOpen {
            shared: Arc::clone(&self.shared),
            reason,
        }
    }

    /// The guard's key type (see [`Builder::key_type`](crate::Builder::key_type)).
    pub fn key_type(&self) -> KeyType {
        self.shared.config.key_type
    }

    /// A snapshot of the filter's figures and the guard's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

/// Keeps a guard failing open; see [`BloomGuard::fail_open`].
#[derive(Debug)]
pub struct FailOpen {
    shared: Arc<Shared>,
    /// The id of its reason, if it gave one.
    reason: Option<u64>,
}

impl Drop for FailOpen {
    fn drop(&mut self) {
        if let Some(reason) = self.reason {
            self.shared.health.remove_hold_reason(reason);
        }
        self.shared.release_open();
    }
}
