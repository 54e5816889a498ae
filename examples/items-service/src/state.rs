//! What the handlers share, and the background tasks to stop with them.

use std::sync::{Arc, Mutex, PoisonError};

use bloom_guard::{cache::ReadThroughCache, BloomGuard};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Feed;
use crate::db::{Database, Item};
use crate::guards::Guards;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The items and users tables.
    pub db: Database,
    /// The read-through cache in front of the items table.
    pub cache: ReadThroughCache<String, Item>,
    /// The guards, or `None` when run with `BLOOM_GUARD=off`.
    pub guards: Option<Guards>,
    /// Where the database's changes come from (`BLOOM_FEED`): the feed
    /// installed at start, guarded or not (another instance may guard).
    pub feed: Feed,
    /// Set on shutdown, for the background tasks.
    stop: Arc<watch::Sender<bool>>,
    /// The tasks keeping the filters complete, awaited on shutdown.
    keepers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl AppState {
    /// State for `db`, guarded by `guards`, with the service's cache
    /// settings; the feed is the guards' (the triggers without guards,
    /// unless [`with_feed`](Self::with_feed) says otherwise).
    pub fn new(db: Database, guards: Option<Guards>) -> Self {
        let feed = match guards.as_ref().and_then(|guards| guards.log_feed.as_ref()) {
            Some(_) => Feed::Log,
            None => Feed::Triggers,
        };
        Self {
            db,
            cache: ReadThroughCache::builder().max_capacity(100_000).build(),
            guards,
            feed,
            stop: Arc::new(watch::channel(false).0),
            keepers: Arc::default(),
        }
    }

    /// The feed to install at start (`BLOOM_FEED`), also with no guards.
    #[must_use]
    pub fn with_feed(mut self, feed: Feed) -> Self {
        self.feed = feed;
        self
    }

    /// Completes once [`shut_down`](Self::shut_down) is called.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.subscribe();
        async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        }
    }

    pub(crate) fn keep(&self, task: JoinHandle<()>) {
        lock(&self.keepers).push(task);
    }

    /// Stops the background tasks (the followers close their connections)
    /// and closes the database pool.
    pub async fn shut_down(&self) {
        self.stop.send_replace(true);
        let keepers = std::mem::take(&mut *lock(&self.keepers));
        for keeper in keepers {
            let _ = keeper.await;
        }
        self.db.close().await;
    }

    pub(crate) fn items_guard(&self) -> Option<&BloomGuard> {
        self.guards.as_ref().map(|guards| &guards.items)
    }
}

/// Locks a mutex whose data stays valid even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
