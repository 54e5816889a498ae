//! A read-through cache for what the guard lets through.

use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use moka::Expiry;

/// A read-through cache on [moka]: positive and negative entries, one load
/// per key at a time, jittered expiry.
///
/// - **Negative entries.** A key the guard let through (a false positive)
///   that the loader does not find is remembered as missing for a short
///   time, so repeated requests for it stop reaching the database.
/// - **Writes win.** A "not found" loaded while the key was inserted or
///   invalidated is answered but not kept: it may predate the write.
/// - **Coalescing.** Concurrent requests for one key share a single load;
///   a failed load is returned to all of them and cached for none.
/// - **Jitter.** Each entry lives its TTL ± a fraction (10% by default), so
///   entries loaded together do not expire together.
/// - **Bounded.** At most `max_capacity` entries, evicted by moka's TinyLFU
///   policy.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use bloom_guard::cache::ReadThroughCache;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cache: ReadThroughCache<String, String> = ReadThroughCache::builder()
///     .max_capacity(10_000)
///     .ttl(Duration::from_secs(60))
///     .negative_ttl(Duration::from_secs(5))
///     .build();
///
/// let value = cache
///     .get_or_load("alice".to_owned(), || async {
///         // the database query
///         Ok::<_, std::io::Error>(Some("Alice".to_owned()))
///     })
///     .await;
/// assert_eq!(value.unwrap(), Some("Alice".to_owned()));
/// # }
/// ```
#[derive(Clone)]
pub struct ReadThroughCache<K, V> {
    cache: Cache<K, Entry<V>>,
    counters: Arc<Counters>,
}

#[derive(Debug, Clone)]
enum Entry<V> {
    Found(V),
    Missing,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    negative_hits: AtomicU64,
    loads: AtomicU64,
    load_errors: AtomicU64,
    /// Inserts and invalidations so far: a load that spans one does not
    /// keep a "not found".
    writes: AtomicU64,
}

impl<K, V> std::fmt::Debug for ReadThroughCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadThroughCache")
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// Counters of a [`ReadThroughCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups answered by a positive entry.
    pub hits: u64,
    /// Lookups answered by a negative ("not found") entry.
    pub negative_hits: u64,
    /// Loads run (one per coalesced group of lookups).
    pub loads: u64,
    /// Loads that failed.
    pub load_errors: u64,
    /// Entries held now (approximate).
    pub entries: u64,
}

impl<K, V> ReadThroughCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A builder with the defaults: 100 000 entries, a 5 minute TTL, a 30
    /// second negative TTL, 10% jitter.
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::default()
    }

    /// The value of `key`: from the cache, or from `load` on a miss.
    ///
    /// `load` answers `Ok(None)` when the key does not exist; that is cached
    /// as a negative entry. Concurrent calls for one key run one `load`.
    ///
    /// # Errors
    ///
    /// The error of `load`, shared by every caller waiting for that load.
    /// Errors are not cached: the next call loads again.
    pub async fn get_or_load<F, Fut, E>(&self, key: K, load: F) -> Result<Option<V>, Arc<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<V>, E>>,
        E: Send + Sync + 'static,
    {
        let counters = &self.counters;
        let writes_before = counters.writes.load(Ordering::Acquire);
        let entry = self
            .cache
            .entry(key)
            .or_try_insert_with(async {
                counters.loads.fetch_add(1, Ordering::Relaxed);
                let value = load().await.inspect_err(|_| {
                    counters.load_errors.fetch_add(1, Ordering::Relaxed);
                })?;
                Ok(value.map_or(Entry::Missing, Entry::Found))
            })
            .await?;
        let loaded = entry.is_fresh();
        if loaded
            && matches!(entry.value(), Entry::Missing)
            && counters.writes.load(Ordering::Acquire) != writes_before
        {
            // A write landed while this load read "not found": the answer
            // may predate it, so it must not outlive this call.
            self.cache.invalidate(entry.key()).await;
        }
        match entry.into_value() {
            Entry::Found(value) => {
                if !loaded {
                    counters.hits.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Some(value))
            }
            Entry::Missing => {
                if !loaded {
                    counters.negative_hits.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None)
            }
        }
    }

    /// Stores a value, for instance right after writing it.
    pub async fn insert(&self, key: K, value: V) {
        self.counters.writes.fetch_add(1, Ordering::AcqRel);
        self.cache.insert(key, Entry::Found(value)).await;
    }

    /// Forgets a key, positive or negative: call it when the key is created
    /// (its negative entry would hide it) or changed or deleted.
    pub async fn invalidate<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.counters.writes.fetch_add(1, Ordering::AcqRel);
        self.cache.invalidate(key).await;
    }

    /// Forgets every entry: for when keys may have been created without a
    /// word to this cache (a follower catching up on lost notifications).
    pub fn invalidate_all(&self) {
        self.counters.writes.fetch_add(1, Ordering::AcqRel);
        self.cache.invalidate_all();
    }

    /// The cache's counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            negative_hits: c.negative_hits.load(Ordering::Relaxed),
            loads: c.loads.load(Ordering::Relaxed),
            load_errors: c.load_errors.load(Ordering::Relaxed),
            entries: self.cache.entry_count(),
        }
    }
}

/// Configures a [`ReadThroughCache`].
#[derive(Debug, Clone)]
pub struct CacheBuilder<K, V> {
    max_capacity: u64,
    ttl: Duration,
    negative_ttl: Duration,
    jitter: f64,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Default for CacheBuilder<K, V> {
    fn default() -> Self {
        Self {
            max_capacity: 100_000,
            ttl: Duration::from_secs(300),
            negative_ttl: Duration::from_secs(30),
            jitter: 0.1,
            types: PhantomData,
        }
    }
}

impl<K, V> CacheBuilder<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The most entries held, positive and negative together.
    #[must_use]
    pub fn max_capacity(mut self, entries: u64) -> Self {
        self.max_capacity = entries;
        self
    }

    /// How long a found value is kept.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a "not found" is kept. Keep it short: it is what a key
    /// created elsewhere waits for before it shows here, unless the creator
    /// invalidates it.
    #[must_use]
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl = ttl;
        self
    }

    /// The spread of expiry times, as a fraction of the TTL (default 0.1:
    /// ±10%), clamped to `0.0..=0.5`.
    #[must_use]
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 0.5);
        self
    }

    /// Builds the cache.
    pub fn build(self) -> ReadThroughCache<K, V> {
        let expiry = JitteredExpiry {
            ttl: self.ttl,
            negative_ttl: self.negative_ttl,
            jitter: self.jitter,
        };
        ReadThroughCache {
            cache: Cache::builder()
                .max_capacity(self.max_capacity)
                .expire_after(expiry)
                .build(),
            counters: Arc::default(),
        }
    }
}

struct JitteredExpiry {
    ttl: Duration,
    negative_ttl: Duration,
    jitter: f64,
}

impl JitteredExpiry {
    fn jittered(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(1.0 - self.jitter + 2.0 * self.jitter * fastrand::f64())
    }
}

impl<K, V> Expiry<K, Entry<V>> for JitteredExpiry {
    fn expire_after_create(
        &self,
        _key: &K,
        value: &Entry<V>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(match value {
            Entry::Found(_) => self.jittered(self.ttl),
            Entry::Missing => self.jittered(self.negative_ttl),
        })
    }

    fn expire_after_update(
        &self,
        key: &K,
        value: &Entry<V>,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, value, updated_at)
    }
}

#[cfg(test)]
mod tests;
