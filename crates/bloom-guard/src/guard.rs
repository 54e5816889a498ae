//! The `BloomGuard` handle, its builder and the state they share.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Request, Response};

use crate::extract::{KeyExtractor, PathParam};
use crate::filter::Filter;
use crate::key::{Key, KeyError};
use crate::response::CannedResponse;
use crate::stats::{State, Stats};

/// A Bloom filter of every key in a database, and the tower [`Layer`] that
/// answers requests for keys it does not hold.
///
/// # The handle
///
/// `BloomGuard` is a cheap-to-clone handle (an `Arc` inside): keep one in
/// your application state to [`insert`](Self::insert) keys as you write them,
/// hand one to [`warm`](Self::warm) to load the database's keys, and pass one
/// to `.route_layer(..)` to guard routes. All clones share one filter.
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
/// use bloom_guard::{BloomGuard, KeyList, PathParam};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = BloomGuard::builder()
///     .expected_items(1_000_000)
///     .false_positive_rate(0.001)
///     .key(PathParam("key"))
///     .build();
/// tokio::spawn(guard.clone().warm(KeyList::new(["alice", "bob"])));
///
/// let app: Router = Router::new()
///     .route("/items/{key}", get(|| async { "found" }))
///     .route_layer(guard.clone());
///
/// guard.insert("carol"); // before the row commits
/// # }
/// ```
///
/// [`Layer`]: tower_layer::Layer
#[derive(Debug, Clone)]
pub struct BloomGuard<K = PathParam> {
    pub(crate) shared: Arc<Shared>,
    pub(crate) extractor: K,
}

/// What the guard decided for one request.
pub(crate) enum Verdict<'a> {
    Pass,
    Reject(&'a CannedResponse),
    BadKey(KeyError),
}

impl BloomGuard {
    /// A builder with the defaults: the key is the axum path parameter
    /// `key`, 1000 expected items, a 0.1% false-positive rate, keys of at
    /// most 512 bytes, and [`not_found_response`](crate::not_found_response)
    /// for absent keys.
    pub fn builder() -> Builder<PathParam> {
        Builder::default()
    }
}

impl<K> BloomGuard<K> {
    /// Adds a key to the filter: call it before the row holding the key
    /// commits.
    ///
    /// Inserting first means a failed write leaves only a harmless false
    /// positive, while inserting after the commit would leave a window in
    /// which the new key is rejected. The key also goes into any filter being
    /// built, and is remembered for a while (see
    /// [`Builder::write_window`]) so a build whose scan started before the
    /// row committed still gets it.
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

    /// Whether the key may exist: `false` means it certainly does not.
    /// Always `true` while no filter is in place (the guard fails open).
    pub fn may_contain(&self, key: impl AsRef<[u8]>) -> bool {
        self.shared.may_contain(&Key::from(key.as_ref()))
    }

    /// Whether a filter is in place and the guard answers absent keys.
    pub fn is_ready(&self) -> bool {
        self.shared.current.load().is_some()
    }

    /// A snapshot of the filter's figures and the guard's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Decides a request: pass it on, answer it as absent, or refuse its key.
    pub(crate) fn check<B>(&self, req: &Request<B>) -> Verdict<'_>
    where
        K: KeyExtractor<B>,
    {
        let shared = &*self.shared;
        let key = match self.extractor.extract(req) {
            Ok(Some(key)) => key,
            Ok(None) => return Verdict::Pass,
            Err(error) => return shared.bad_key(error),
        };
        if key.len() > shared.config.max_key_len {
            return shared.bad_key(KeyError::TooLong {
                len: key.len(),
                max: shared.config.max_key_len,
            });
        }
        if shared.may_contain(&key) {
            shared.passed.fetch_add(1, Ordering::Relaxed);
            Verdict::Pass
        } else {
            shared.rejected.fetch_add(1, Ordering::Relaxed);
            Verdict::Reject(&shared.config.absent)
        }
    }
}

/// Configures and builds a [`BloomGuard`].
///
/// # Example
///
/// ```
/// use bloom_guard::{BloomGuard, QueryParam};
///
/// let guard = BloomGuard::builder()
///     .key(QueryParam("id"))
///     .expected_items(10_000_000)
///     .false_positive_rate(0.0001)
///     .max_key_len(64)
///     .build();
/// # drop(guard);
/// ```
#[derive(Debug, Clone)]
pub struct Builder<K> {
    extractor: K,
    config: Config,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) expected_items: u64,
    pub(crate) target_fpp: f64,
    pub(crate) headroom: f64,
    pub(crate) max_key_len: usize,
    pub(crate) absent: CannedResponse,
    pub(crate) write_window: Duration,
    pub(crate) progress_interval: Duration,
    pub(crate) max_retry_delay: Duration,
}

impl Default for Builder<PathParam> {
    fn default() -> Self {
        Self {
            extractor: PathParam("key"),
            config: Config {
                expected_items: 1000,
                target_fpp: 0.001,
                headroom: 0.25,
                max_key_len: 512,
                absent: CannedResponse::not_found(),
                write_window: Duration::from_secs(60),
                progress_interval: Duration::from_secs(5),
                max_retry_delay: Duration::from_secs(30),
            },
        }
    }
}

impl<K> Builder<K> {
    /// Where to find each request's key: a [`PathParam`], a
    /// [`PathSegment`](crate::PathSegment), a [`QueryParam`](crate::QueryParam),
    /// a [`Header`](crate::Header), or a closure. See [`KeyExtractor`].
    #[must_use]
    pub fn key<K2>(self, extractor: K2) -> Builder<K2> {
        Builder {
            extractor,
            config: self.config,
        }
    }

    /// A floor for the filter's size. Each build sizes the filter for the
    /// larger of this and the source's count hint, plus headroom.
    #[must_use]
    pub fn expected_items(mut self, items: u64) -> Self {
        self.config.expected_items = items;
        self
    }

    /// The false-positive rate to size the filter for (default 0.001): the
    /// share of absent keys that still reach your cache and database.
    ///
    /// # Panics
    ///
    /// If `rate` is not strictly between 0 and 1.
    #[must_use]
    pub fn false_positive_rate(mut self, rate: f64) -> Self {
        assert!(
            rate > 0.0 && rate < 1.0,
            "false_positive_rate must be in (0, 1), got {rate}"
        );
        self.config.target_fpp = rate;
        self
    }

    /// Extra room for keys inserted after a build, as a fraction of the
    /// build's count (default 0.25: 25% more keys before the rate passes
    /// its target).
    ///
    /// # Panics
    ///
    /// If `fraction` is negative or not finite.
    #[must_use]
    pub fn headroom(mut self, fraction: f64) -> Self {
        assert!(
            fraction >= 0.0 && fraction.is_finite(),
            "headroom must be >= 0, got {fraction}"
        );
        self.config.headroom = fraction;
        self
    }

    /// The longest key in bytes, after decoding (default 512). Longer keys
    /// get a `400` before any hashing.
    #[must_use]
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.config.max_key_len = bytes;
        self
    }

    /// The response for absent keys (default:
    /// [`not_found_response`](crate::not_found_response)). Make it
    /// byte-identical to your handler's own "not found".
    #[must_use]
    pub fn absent_response<B: Into<Bytes>>(mut self, response: Response<B>) -> Self {
        self.config.absent = CannedResponse::from_response(response);
        self
    }

    /// How long a write may take between [`BloomGuard::insert`] and its
    /// commit (default 60 s). A filter build replays the keys inserted this
    /// long before it started, so a row that commits after the build's scan
    /// began is not lost.
    #[must_use]
    pub fn write_window(mut self, window: Duration) -> Self {
        self.config.write_window = window;
        self
    }

    /// How often a build logs its progress (default 5 s).
    #[must_use]
    pub fn progress_interval(mut self, interval: Duration) -> Self {
        self.config.progress_interval = interval;
        self
    }

    /// The longest pause between two attempts of [`BloomGuard::warm`]
    /// (default 30 s); pauses start at 100 ms and double.
    #[must_use]
    pub fn max_retry_delay(mut self, delay: Duration) -> Self {
        self.config.max_retry_delay = delay;
        self
    }

    /// Builds the guard. It fails open until [`BloomGuard::warm`] (or
    /// [`BloomGuard::rebuild`]) puts a first filter in place.
    pub fn build(self) -> BloomGuard<K> {
        BloomGuard {
            shared: Arc::new(Shared::new(self.config)),
            extractor: self.extractor,
        }
    }
}

/// Keys written recently, replayed into a filter whose build starts.
#[derive(Debug, Default)]
struct Journal {
    entries: VecDeque<(Instant, Box<[u8]>)>,
}

/// The longest the journal gets, whatever the write rate.
const JOURNAL_CAPACITY: usize = 100_000;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) current: ArcSwapOption<Filter>,
    /// Filters being built. Inserts take the read lock, registration the
    /// write lock: once a filter is registered, every insert that started
    /// earlier has finished and is in the journal.
    building: RwLock<Vec<Arc<Filter>>>,
    journal: Mutex<Journal>,
    pub(crate) generation: AtomicU64,
    state: AtomicU8,
    passed: AtomicU64,
    rejected: AtomicU64,
    bad_keys: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// One build at a time.
    pub(crate) build_lock: tokio::sync::Mutex<()>,
}

impl Shared {
    fn new(config: Config) -> Self {
        Self {
            config,
            current: ArcSwapOption::empty(),
            building: RwLock::new(Vec::new()),
            journal: Mutex::new(Journal::default()),
            generation: AtomicU64::new(0),
            state: AtomicU8::new(State::Warming.as_u8()),
            passed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            bad_keys: AtomicU64::new(0),
            last_error: Mutex::new(None),
            build_lock: tokio::sync::Mutex::new(()),
        }
    }

    #[inline]
    pub(crate) fn may_contain(&self, key: &Key<'_>) -> bool {
        match &*self.current.load() {
            Some(filter) => filter.contains(key),
            None => true,
        }
    }

    fn bad_key(&self, error: KeyError) -> Verdict<'_> {
        self.bad_keys.fetch_add(1, Ordering::Relaxed);
        Verdict::BadKey(error)
    }

    pub(crate) fn insert(&self, key: &Key<'_>) {
        let building = self.building.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(filter) = &*self.current.load() {
            filter.insert(key);
        }
        for filter in building.iter() {
            filter.insert(key);
        }
        let now = Instant::now();
        let mut journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        journal.entries.push_back((now, key.as_bytes().into()));
        while journal.entries.len() > JOURNAL_CAPACITY
            || journal
                .entries
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > self.config.write_window)
        {
            journal.entries.pop_front();
        }
    }

    /// Makes `filter` receive every insert from now on, plus the journal.
    pub(crate) fn register(&self, filter: &Arc<Filter>) {
        let mut building = self
            .building
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let journal = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        for (at, key) in journal.entries.iter().rev() {
            if now.duration_since(*at) > self.config.write_window {
                break;
            }
            filter.insert(&Key::from(&key[..]));
        }
        building.push(Arc::clone(filter));
    }

    pub(crate) fn unregister(&self, filter: &Arc<Filter>) {
        let mut building = self
            .building
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        building.retain(|f| !Arc::ptr_eq(f, filter));
    }

    /// Puts a registered filter in use. Swapping and unregistering happen
    /// under the write lock so no insert can fall between the two.
    pub(crate) fn promote(&self, filter: &Arc<Filter>) -> u64 {
        let mut building = self
            .building
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        self.current.store(Some(Arc::clone(filter)));
        building.retain(|f| !Arc::ptr_eq(f, filter));
        drop(building);
        self.set_state(State::Ready);
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn record_failure(&self, error: String) {
        if self.current.load().is_none() {
            self.set_state(State::Degraded);
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error);
    }

    fn set_state(&self, state: State) {
        self.state.store(state.as_u8(), Ordering::Release);
    }

    pub(crate) fn stats(&self) -> Stats {
        let current = self.current.load();
        let filter = current.as_deref();
        let fill = filter.map_or(0.0, Filter::fill);
        let hashes = filter.map_or(0, Filter::hashes);
        Stats {
            state: State::from_u8(self.state.load(Ordering::Acquire)),
            generation: self.generation.load(Ordering::Acquire),
            keys: filter.map_or(0, Filter::keys),
            capacity: filter.map_or(0, Filter::capacity),
            bits: filter.map_or(0, Filter::bits),
            hashes,
            fill,
            target_fpp: self.config.target_fpp,
            estimated_fpp: fill.powi(hashes as i32),
            passed: self.passed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            bad_keys: self.bad_keys.load(Ordering::Relaxed),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}
