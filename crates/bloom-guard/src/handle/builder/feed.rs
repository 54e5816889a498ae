//! The builder's settings for a guard that follows a change feed: what it
//! forgets, its write window and its read barrier.

use std::time::Duration;

use super::Builder;
use crate::handle::config::DEFAULT_READ_BARRIER;
use crate::lifecycle::barrier::ReadPace;
use crate::request::found::Found;

impl Builder {
    /// Whether a guard followed by a change feed forgets deleted rows
    /// (default `true`): its builds make counting filters, which remove a
    /// key with its last row as the feed brings the deletes, so no
    /// scheduled rebuild is needed. `false` keeps the Bloom filter, which
    /// only ever adds keys: deleted keys pass to the handler until the next
    /// rebuild (see [`rebuild_interval`](Self::rebuild_interval)). A guard
    /// without a feed always has a Bloom filter. The crate's filters page
    /// compares the two.
    ///
    /// ```
    /// use bloom_guard::BloomGuard;
    ///
    /// let guard = BloomGuard::builder().forget_deleted_keys(false).build();
    /// # let _ = guard;
    /// ```
    #[must_use]
    pub fn forget_deleted_keys(mut self, enabled: bool) -> Self {
        self.config.forget_deleted = enabled;
        self
    }

    /// How long a write may take between [`BloomGuard::insert`](crate::BloomGuard::insert) and its
    /// commit (default 60 s): lookups find a key this instance inserted
    /// for this long whatever filter is in use, so it finds its own new key
    /// even when its row commits after a build's scan began (other
    /// instances, and this one afterwards, get it from the change feed).
    ///
    /// With the [read barrier](Self::read_barrier) and one follower, a key
    /// leaves the window early, once a feed read that began after the
    /// insert brings its row: the filter holds it from then on, and a
    /// delete by any client is refused as soon as the feed brings it, not a
    /// window later. Without the barrier the whole window applies.
    #[must_use]
    pub fn write_window(mut self, window: Duration) -> Self {
        self.config.write_window = window;
        self
    }

    /// Whether the guard waits, before it answers "absent", for its
    /// follower to read the change feed from after the request arrived
    /// (default `true`): then a key committed before the request arrived,
    /// by any instance or SQL client, is never refused.
    ///
    /// Only a would-be refusal waits (a lookup's worth of latency plus one
    /// feed read, shared by every refusal waiting at that moment); keys the
    /// filter holds never do. A guard without a follower (a
    /// [`KeyList`](crate::KeyList)) has nothing to wait for and refuses at
    /// once. Turned off, the guard refuses on its filter as it is: a key
    /// written by another instance or a SQL client is refused until the
    /// follower's next read brings it (the propagation window, tens of
    /// milliseconds), which an app whose clients create and then read at
    /// once would see as missing.
    ///
    /// While a refusal waits, the inner service has already been called
    /// (its future is made at once and polled only if the key turns out
    /// present, so a found key costs no extra latency): a plain axum router
    /// does no work until polled, but a service that works in `call` itself
    /// (tower's `Buffer`, which hands the request to its worker) may run
    /// the handler for a key that is then refused. Put such layers inside
    /// the guard's only if that is fine, or outside it. And once every
    /// follower of the guard has stopped (shut down, or a hook that
    /// panicked), the filter no longer follows the table: would-be refusals
    /// then go to the handler.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use bloom_guard::BloomGuard;
    ///
    /// // The default: wait at most 200 ms, then pass the request on.
    /// let guard = BloomGuard::builder().read_barrier_timeout(Duration::from_millis(200)).build();
    /// // The bounded window instead of the wait.
    /// let fast = BloomGuard::builder().read_barrier(false).build();
    /// # let _ = (guard, fast);
    /// ```
    #[must_use]
    pub fn read_barrier(mut self, enabled: bool) -> Self {
        self.config.read_barrier = if enabled {
            Some(self.config.read_barrier.unwrap_or(DEFAULT_READ_BARRIER))
        } else {
            None
        };
        self
    }

    /// How long a refusal waits for the read barrier's feed read (default
    /// 200 ms) before the request goes on to the handler: a database that
    /// is down or slow costs lookups, never a refusal from a stale filter.
    /// Turns the barrier on.
    #[must_use]
    pub fn read_barrier_timeout(mut self, bound: Duration) -> Self {
        self.config.read_barrier = Some(bound);
        self
    }

    /// How often the guard's followers read the feed while refusals wait
    /// (see [`ReadPace`]): by default at once after a quiet spell, and in
    /// a flood one read per 56 refusals or per 12 ms, at most 2 000 reads
    /// a second. Give every guard of an instance a clone of one pace to
    /// share one ceiling.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::{BloomGuard, feed::ReadPace};
    ///
    /// let guard = BloomGuard::builder()
    ///     .read_pace(ReadPace::default().max_reads_per_sec(500))
    ///     .build();
    /// # let _ = guard;
    /// ```
    #[must_use]
    pub fn read_pace(mut self, pace: ReadPace) -> Self {
        self.config.read_pace = pace;
        self
    }

    /// Which answers of the inner service mean "the key exists" (default:
    /// any 2xx or 3xx). Shadow mode and the audits pass a would-be refusal
    /// on and count it a false negative if its answer says the key exists,
    /// so the test must fit the route: a redirect (a URL shortener's 302)
    /// is found by default; a route that answers an absent key with a 200
    /// (`{"found": false}`) must say how its absent answers look, or every
    /// one of them counts as a false negative.
    ///
    /// # Example
    ///
    /// ```
    /// use bloom_guard::BloomGuard;
    ///
    /// // The route marks its absent answers with a header.
    /// let guard = BloomGuard::builder()
    ///     .found_when(|status, headers| {
    ///         status.is_success() && !headers.contains_key("x-not-found")
    ///     })
    ///     .build();
    /// # let _ = guard;
    /// ```
    #[must_use]
    pub fn found_when(
        mut self,
        found: impl Fn(http::StatusCode, &http::HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.config.found = Found::new(found);
        self
    }
}
