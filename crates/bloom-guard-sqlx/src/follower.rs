//! Keeping a guard true while the database changes: LISTEN/NOTIFY, catch-up
//! after lost notifications, and scheduled rebuilds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{BloomGuard, HoldOpen};
use sqlx::postgres::{PgListener, PgNotification, PgPoolOptions};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio::time::{interval, sleep, Instant, MissedTickBehavior};

use crate::pg_copy::PgCopySource;

type KeyHook = Arc<dyn Fn(&str) + Send + Sync>;
type CatchUpHook = Arc<dyn Fn() + Send + Sync>;

/// The `application_name` of the listener's connection, to find it in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "bloom-guard-listener";

/// Keeps a guard's filter true while the database changes, from every
/// instance and every SQL client.
///
/// [`run`](Self::run) does it all, for as long as it runs:
///
/// 1. **Listen first.** It LISTENs on a connection of its own (never one of
///    the pool's), then warms the guard up: a key committed during the
///    warm-up's scan arrives as a notification.
/// 2. **Follow.** Each notification's key goes into the guard (and to
///    [`on_key`](Self::on_key), to drop a negative cache entry; after lost
///    notifications, [`on_catch_up`](Self::on_catch_up) drops them all). Keys over
///    7900 bytes arrive as their row id and are fetched; a bulk load of
///    more than 10 000 rows in one statement arrives as one "catch up".
/// 3. **Detect loss.** Notifications sent while the listener is
///    disconnected are gone, and a half-open connection shows no error at
///    all. Besides errors, a heartbeat (a NOTIFY sent through the pool every
///    [`heartbeat`](Self::heartbeat) that must come back on the listener)
///    catches both.
/// 4. **Catch up.** After any loss the guard fails open (see
///    [`BloomGuard::hold_open`]) until the listener is back and a rebuild
///    whose scan started after it was back has finished. That rebuild's
///    snapshot holds every row committed before it, including rows that
///    took an earlier id but committed late; later commits arrive as
///    notifications. No committed key is missed.
/// 5. **Maintain.** Runs [`BloomGuard::maintain`]: rebuilds on the guard's
///    schedule and when inserts outgrow the filter.
///
/// The table needs the triggers of `migrations/0002_items_notify.sql`
/// (adapt the table and column names for your own tables).
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::PgFollower;
///
/// # async fn run(pool: sqlx::PgPool) {
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(PgFollower::new(guard.clone(), pool, "select key from items").run());
/// # }
/// ```
pub struct PgFollower<K> {
    guard: BloomGuard<K>,
    pool: PgPool,
    source: PgCopySource,
    channel: String,
    key_by_id: String,
    heartbeat: Duration,
    on_key: Option<KeyHook>,
    on_catch_up: Option<CatchUpHook>,
}

impl<K> std::fmt::Debug for PgFollower<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFollower")
            .field("channel", &self.channel)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

/// Why the listener stopped hearing reliably.
enum Lost {
    Connection(sqlx::Error),
    Closed,
    Heartbeat,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::Connection(error) => write!(f, "listener connection failed: {error}"),
            Lost::Closed => f.write_str("listener connection closed"),
            Lost::Heartbeat => f.write_str("a heartbeat did not come back in time"),
        }
    }
}

impl<K> PgFollower<K>
where
    K: Clone + Send + Sync + 'static,
{
    /// A follower for `guard`, reading keys with `key_query` (one text
    /// column, as for [`PgCopySource`]) through `pool`.
    pub fn new(guard: BloomGuard<K>, pool: PgPool, key_query: impl Into<String>) -> Self {
        Self {
            source: PgCopySource::new(pool.clone(), key_query),
            guard,
            pool,
            channel: "bloom_guard".to_owned(),
            key_by_id: "select key from items where id = $1".to_owned(),
            heartbeat: Duration::from_secs(5),
            on_key: None,
            on_catch_up: None,
        }
    }

    /// The NOTIFY channel (default `bloom_guard`, the migration's).
    #[must_use]
    pub fn channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = channel.into();
        self
    }

    /// The query fetching a long key by its `bigint` id (default
    /// `select key from items where id = $1`).
    #[must_use]
    pub fn key_by_id(mut self, query: impl Into<String>) -> Self {
        self.key_by_id = query.into();
        self
    }

    /// How often the listener's health is checked (default 5 s). A lost
    /// connection is noticed within about twice this, and the guard fails
    /// open from then until it has caught up.
    #[must_use]
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// Called with each key that arrives, after it is in the guard: drop
    /// the key's negative cache entry here.
    #[must_use]
    pub fn on_key(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_key = Some(Arc::new(hook));
        self
    }

    /// Called when keys may have arrived unannounced (notifications were
    /// lost, or a bulk load sent one "catch up"), as the catch-up starts:
    /// drop every negative cache entry here, since no `on_key` will come
    /// for those keys.
    #[must_use]
    pub fn on_catch_up(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_catch_up = Some(Arc::new(hook));
        self
    }

    /// Warms the guard up and keeps it true; runs until dropped. Spawn it.
    pub async fn run(self) {
        self.run_until(std::future::pending()).await;
    }

    /// As [`run`](Self::run), until `shutdown` completes; then closes the
    /// listener's connection cleanly (a Terminate message, no error in
    /// the server's log) and returns.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let maintenance = tokio::spawn(self.guard.clone().maintain(self.source.clone()));
        let _stop_maintenance = AbortOnDrop(maintenance);
        // Nothing is lost before the first warm-up: its scan covers it.
        let mut hold: Option<HoldOpen> = None;
        let mut delay = Duration::from_millis(100);
        let mut first = true;
        loop {
            // A fresh pool each time: a half-open connection is dropped with
            // its pool, never handed out again.
            let pool = self.listener_pool();
            let listener = tokio::select! {
                () = &mut shutdown => None,
                listener = self.listen(&pool) => Some(listener),
            };
            let listener = match listener {
                None => return close(pool).await,
                Some(Ok(listener)) => listener,
                Some(Err(error)) => {
                    tracing::warn!(%error, retry_in = ?delay, "cannot LISTEN; the guard lets every request through");
                    pool.close().await;
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            delay = Duration::from_millis(100);
            let listening_since = Instant::now();
            if first {
                first = false;
                tokio::spawn(self.guard.clone().warm(self.source.clone()));
            } else if let Some(hold) = hold.take() {
                tracing::info!("listening again; catching up on lost notifications");
                self.spawn_catch_up(listening_since, hold);
            }
            // The listener lives in `follow`: dropped with it, before the
            // pool closes.
            let lost = tokio::select! {
                () = &mut shutdown => None,
                lost = self.follow(listener) => Some(lost),
            };
            let Some(lost) = lost else {
                return close(pool).await;
            };
            tracing::warn!(reason = %lost, "notifications may have been lost; the guard lets every request through until it has caught up");
            hold = Some(self.guard.hold_open());
            pool.close().await;
        }
    }

    /// A pool of one connection for the listener alone, named so operators
    /// can find it.
    fn listener_pool(&self) -> PgPool {
        // TCP keepalive from the server's side: Postgres drops the backend
        // of a listener whose host vanished. sqlx exposes no client-side
        // socket keepalive; the heartbeat covers this side.
        let options = (*self.pool.connect_options())
            .clone()
            .application_name(LISTENER_APPLICATION_NAME)
            .options([
                ("tcp_keepalives_idle", "30"),
                ("tcp_keepalives_interval", "10"),
                ("tcp_keepalives_count", "3"),
            ]);
        PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(options)
    }

    async fn listen(&self, pool: &PgPool) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.ignore_pool_close_event(true);
        listener.eager_reconnect(false);
        listener.listen(&self.channel).await?;
        Ok(listener)
    }

    /// Rebuilds from a scan newer than `since` until one succeeds, failing
    /// open meanwhile.
    fn spawn_catch_up(&self, since: Instant, hold: HoldOpen) {
        if let Some(hook) = &self.on_catch_up {
            hook();
        }
        let (guard, source) = (self.guard.clone(), self.source.clone());
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            while guard.rebuild_newer_than(&source, since).await.is_err() {
                sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            tracing::info!("caught up; the guard answers absent keys again");
            drop(hold);
        });
    }

    /// Applies notifications until the listener can no longer be trusted.
    async fn follow(&self, mut listener: PgListener) -> Lost {
        let nonce = format!("h{:016x}", fastrand::u64(..));
        let mut ticks = interval(self.heartbeat);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await;
        let mut awaiting_heartbeat = false;
        loop {
            tokio::select! {
                notification = listener.try_recv() => {
                    let notification = match notification {
                        Ok(Some(notification)) => notification,
                        Ok(None) => return Lost::Closed,
                        Err(error) => return Lost::Connection(error),
                    };
                    if notification.payload() == nonce {
                        awaiting_heartbeat = false;
                    } else {
                        self.apply(&notification).await;
                    }
                }
                _ = ticks.tick() => {
                    if awaiting_heartbeat {
                        return Lost::Heartbeat;
                    }
                    // Through the pool, not the listener: only a round trip
                    // proves the listener still hears.
                    match sqlx::query("select pg_notify($1, $2)")
                        .bind(&self.channel)
                        .bind(&nonce)
                        .execute(&self.pool)
                        .await
                    {
                        Ok(_) => awaiting_heartbeat = true,
                        Err(error) => tracing::debug!(%error, "heartbeat not sent"),
                    }
                }
            }
        }
    }

    async fn apply(&self, notification: &PgNotification) {
        let payload = notification.payload();
        match payload.split_at_checked(1) {
            Some(("k", key)) => self.add(key),
            Some(("i", id)) => match self.fetch(id).await {
                Ok(Some(key)) => self.add(&key),
                Ok(None) => {} // deleted since
                Err(error) => {
                    tracing::warn!(%error, id, "cannot fetch a long key; catching up");
                    self.catch_up_now();
                }
            },
            Some(("c", "")) => {
                tracing::info!("a bulk change was announced; catching up");
                self.catch_up_now();
            }
            // Other instances' heartbeats.
            Some(("h", _)) => {}
            _ => tracing::debug!(payload, "ignored an unknown notification"),
        }
    }

    fn add(&self, key: &str) {
        self.guard.insert(key);
        if let Some(hook) = &self.on_key {
            hook(key);
        }
    }

    async fn fetch(&self, id: &str) -> Result<Option<String>, sqlx::Error> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        sqlx::query_scalar(&self.key_by_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Fails open and rebuilds now: rows committed before this point may be
    /// missing from the filter.
    fn catch_up_now(&self) {
        self.spawn_catch_up(Instant::now(), self.guard.hold_open());
    }
}

/// Closes the listener's pool, its connection with it.
async fn close(pool: PgPool) {
    pool.close().await;
    tracing::info!("stopped following notifications");
}

/// Aborts a task when dropped, so a dropped follower leaves nothing running.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
