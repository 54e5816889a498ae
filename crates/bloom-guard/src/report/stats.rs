//! What the guard reports about itself.

use std::fmt;

use crate::switches::mode::Mode;
use crate::switches::settings::SetBy;

/// Where the guard is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum GuardState {
    /// The guard has not protected yet: the first filter is being built or
    /// completed (fail open: every request passes). [`Stats::reason`]
    /// says what it waits for.
    #[default]
    Warming,
    /// A filter that holds every key, within its false-positive bound, is
    /// in place; absent keys are answered by the guard.
    Ready,
    /// The first filter could not be built yet (the source fails, the
    /// guard retries), and every request passes; or, after the guard was
    /// ready, the filter may be missing keys for a while (a follower
    /// catching up, a gap in the feed) and every request passes, or it
    /// passed its false-positive bound and a rebuild is due.
    /// [`Stats::reason`] says which.
    Degraded,
}

impl GuardState {
    /// The lowercase name: `warming`, `ready` or `degraded`.
    pub fn as_str(self) -> &'static str {
        match self {
            GuardState::Warming => "warming",
            GuardState::Ready => "ready",
            GuardState::Degraded => "degraded",
        }
    }
}

impl fmt::Display for GuardState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot of the guard's filter and counters.
///
/// Filter figures (`keys`, `bits`, ...) describe the filter in use and are
/// zero while none is.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// Where the guard is in its life.
    pub state: GuardState,
    /// Why the guard lets every request through, or protects less than it
    /// should (`state` is not `ready`); `None` while it protects.
    pub reason: Option<String>,
    /// How many filters have been put in place; 0 until the first.
    pub generation: u64,
    /// Distinct keys in the filter (a close, slightly low, count).
    pub keys: u64,
    /// The number of keys the filter's sub-filters are sized for,
    /// headroom included.
    pub capacity: u64,
    /// The sub-filters the filter has grown into: 1 after a build, one
    /// more each time more keys arrive than it was sized for.
    pub sub_filters: u32,
    /// The filter's size in bits.
    pub bits: u64,
    /// Hash functions per key of the first sub-filter.
    pub hashes: u32,
    /// The share of the filter's bits that are set (about 0.5 at capacity).
    pub fill: f64,
    /// The false-positive rate the filter is sized for: every sub-filter's
    /// rates together stay below it.
    pub target_fpp: f64,
    /// The false-positive rate of the filter as it is now, from the fill
    /// of its sub-filters.
    pub estimated_fpp: f64,
    /// The false-positive rate seen: reported false positives over all
    /// lookups of absent keys (rejected or reported). See
    /// [`BloomGuard::record_false_positive`](crate::BloomGuard::record_false_positive).
    pub observed_fpp: f64,
    /// Requests with a key that the guard let through.
    pub passed: u64,
    /// Requests the guard answered itself because their key is absent.
    pub rejected: u64,
    /// Keys the guard let through that the database did not hold, as
    /// reported with `record_false_positive`.
    pub false_positives: u64,
    /// Requests the guard answered with a 400 itself: keys longer than
    /// [`max_key_len`](crate::Builder::max_key_len), with
    /// [`refuse_long_keys`](crate::Builder::refuse_long_keys) on (0
    /// otherwise).
    pub bad_keys: u64,
    /// Requests with a key that the guard passed to the handler without a
    /// lookup, because it could not put the key in canonical form with
    /// certainty, by reason.
    pub unchecked: UncheckedCounts,
    /// Requests the layer could not check (its extractor cannot work where
    /// it sits, such as a `PathParam` outside an axum router), passed on
    /// unchecked. Anything but 0 is a wiring mistake.
    pub unguarded: u64,
    /// What the guard does with its verdicts.
    pub mode: Mode,
    /// Whether `mode` is the builder's default, the fleet's or this
    /// instance's override.
    pub mode_set_by: SetBy,
    /// In enforce mode, the share of would-be rejections passed on and
    /// checked ([`Builder::audit_rate`](crate::Builder::audit_rate)).
    pub audit_rate: f64,
    /// Whether `audit_rate` is the builder's default, the fleet's or this
    /// instance's override.
    pub audit_rate_set_by: SetBy,
    /// Requests shadow mode passed on that enforce mode would have
    /// answered as absent.
    pub shadow_would_reject: u64,
    /// Would-be rejections passed on in enforce mode by the audit sample
    /// ([`Builder::audit_rate`](crate::Builder::audit_rate)).
    pub audited: u64,
    /// Of the would-be rejections passed on (shadow or audit), those the
    /// service answered as found (by default a 2xx or 3xx; see
    /// [`Builder::found_when`](crate::Builder::found_when)): keys that exist but were missing from
    /// the filter. Anything but 0 is a defect to report.
    pub shadow_false_negatives: u64,
    /// Would-be refusals that waited for the read barrier's feed read.
    pub barrier_waits: u64,
    /// Of those, keys the read brought: written elsewhere just before the
    /// request, and answered by the handler instead of refused.
    pub barrier_found: u64,
    /// Of those, requests passed on because no read finished within the
    /// bound, or the last read failed (the database down or slow).
    pub barrier_timeouts: u64,
    /// Stored keys no request can name (not valid UTF-8), left out of the
    /// filter in use.
    pub skipped_keys: u64,
    /// The kind of the filter in use: `counting` for a guard that follows
    /// a change feed (it forgets deleted keys), `bloom` otherwise.
    pub filter_kind: Option<FilterKind>,
    /// Rows' deletes the filter in use applied (a counting filter): keys
    /// refused again without a rebuild.
    pub deletes_applied: u64,
    /// Rows' deletes the filter in use left in it, because it could not
    /// be sure it held their inserts (built without a feed position, or
    /// with several followers) or which of its stages did (the key matched
    /// more than one of a grown filter's stages): each a harmless false
    /// positive until the next rebuild.
    pub deletes_left: u64,
    /// Why the guard is not answering absent keys, or why the last filter
    /// build failed, if it did and none succeeded since.
    pub last_error: Option<String>,
    /// Where the filter in use came from: a scan of the key source, or a
    /// snapshot another instance published.
    pub origin: Option<FilterOrigin>,
    /// Milliseconds since the filter in use was put in place.
    pub age_ms: Option<u64>,
    /// Where the change feed that keeps the filter complete stands, once
    /// a follower has read it.
    pub feed: Option<FeedStatus>,
}

/// Requests passed to the handler without a lookup, by reason; each field
/// is a [`KeyError`](crate::keys::KeyError) variant of that name.
///
/// A steady share of `too_long` or `uncomparable` keys is traffic the
/// filter does not protect against: raise
/// [`max_key_len`](crate::Builder::max_key_len) to the column's longest
/// key, or choose a [`KeyType`](crate::KeyType) that compares these keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UncheckedCounts {
    /// Keys longer than [`max_key_len`](crate::Builder::max_key_len).
    pub too_long: u64,
    /// Keys that are not UTF-8 once decoded.
    pub not_utf8: u64,
    /// Keys given more than once in the request.
    pub ambiguous: u64,
    /// Values that are not keys of the guard's key type.
    pub not_of_key_type: u64,
    /// Keys with characters the key type cannot compare as the database does.
    pub uncomparable: u64,
}

impl UncheckedCounts {
    /// Every unchecked request, whatever the reason.
    pub fn total(&self) -> u64 {
        self.too_long + self.not_utf8 + self.ambiguous + self.not_of_key_type + self.uncomparable
    }
}

/// The kind of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum FilterKind {
    /// A growing Bloom filter (fastbloom): lock-free, only ever adds keys.
    Bloom,
    /// A counting quotient filter (qfilter): one fingerprint per stored
    /// row, removed with the row.
    Counting,
}

impl FilterKind {
    /// `bloom` or `counting`.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterKind::Bloom => "bloom",
            FilterKind::Counting => "counting",
        }
    }
}

/// Where a filter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum FilterOrigin {
    /// A scan of every key of the source.
    Scan,
    /// A snapshot, completed by replaying the change feed from its position.
    Snapshot,
}

impl FilterOrigin {
    /// `scan` or `snapshot`.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterOrigin::Scan => "scan",
            FilterOrigin::Snapshot => "snapshot",
        }
    }
}

/// Where a guard's change feed stands: reported by the follower that reads
/// it, through [`FeedHandle::record_read`](crate::feed::FeedHandle::record_read).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FeedStatus {
    /// The feed's own name for the position read up to (a Postgres
    /// snapshot such as `1057:1060:1057`, a SQLite row id).
    pub position: String,
    /// Changes read since the follower started.
    pub changes: u64,
    /// Reads of the feed since the follower started.
    pub reads: u64,
    /// Of those reads, how many one statement made together with another
    /// guard's (followers of one instance on one database share a read
    /// when refusals of both wait).
    pub shared_reads: u64,
    /// Milliseconds since the last successful read: every key committed
    /// before then is in the filter.
    pub read_ago_ms: u64,
    /// The feed's room in the database and its pruning, where the feed
    /// reports them (Postgres, at every prune, about once a minute).
    pub storage: Option<FeedStorage>,
    /// Where the feed is written after the commit (the Postgres log feed,
    /// from the write-ahead log): how long the last write of the feed
    /// before this read took from its oldest commit, in milliseconds.
    /// `None` where the feed is written in the writer's own transaction
    /// (triggers). Exported as `bloom_guard_feed_lag_seconds`.
    pub lag_ms: Option<u64>,
}

/// The change feed's room in the database, and whether its pruning keeps
/// up: reported by a follower through
/// [`FeedHandle::record_storage`](crate::feed::FeedHandle::record_storage).
/// Exported as `bloom_guard_feed_bytes` and
/// `bloom_guard_feed_prune_overdue_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FeedStorage {
    /// The feed's tables and indexes, in bytes.
    pub bytes: u64,
    /// How long the oldest retired part of the feed has been due for
    /// removal, in seconds (0: none is). Up to the pruning's interval is
    /// normal; more means a long transaction holds the removal back, or
    /// nothing prunes.
    pub prune_overdue_secs: u64,
}

impl FeedStorage {
    /// `bytes` in the feed, its pruning `prune_overdue_secs` late.
    pub fn new(bytes: u64, prune_overdue_secs: u64) -> Self {
        Self {
            bytes,
            prune_overdue_secs,
        }
    }
}

impl FeedStatus {
    /// The status after a read up to `position`, with `changes` read in all.
    pub fn new(position: impl Into<String>, changes: u64) -> Self {
        Self {
            position: position.into(),
            changes,
            reads: 0,
            shared_reads: 0,
            read_ago_ms: 0,
            storage: None,
            lag_ms: None,
        }
    }

    /// With the feed's commit-to-feed lag as of the read, where the feed
    /// is written after the commit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bloom_guard::{BloomGuard, stats::FeedStatus};
    ///
    /// let guard = BloomGuard::builder().build();
    /// guard.feed().record_read(FeedStatus::new("0/16B3748", 3).with_lag(Some(Duration::from_millis(12))));
    /// assert_eq!(guard.stats().feed.and_then(|feed| feed.lag_ms), Some(12));
    /// ```
    #[must_use]
    pub fn with_lag(mut self, lag: Option<std::time::Duration>) -> Self {
        self.lag_ms = lag.map(|lag| u64::try_from(lag.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// With `reads` reads since the follower started, `shared` of them made
    /// by one statement with another guard's.
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, stats::FeedStatus};
    ///
    /// let guard = BloomGuard::builder().build();
    /// guard.feed().record_read(FeedStatus::new("7", 3).with_reads(10, 4));
    /// let feed = guard.stats().feed.expect("a read was recorded");
    /// assert_eq!((feed.reads, feed.shared_reads), (10, 4));
    /// ```
    #[must_use]
    pub fn with_reads(mut self, reads: u64, shared: u64) -> Self {
        self.reads = reads;
        self.shared_reads = shared;
        self
    }
}
