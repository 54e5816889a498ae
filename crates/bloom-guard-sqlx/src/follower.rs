//! Keeping a guard complete while the database changes: the Postgres change
//! feed, read on every wake-up and interval, and the maintenance around it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{BloomGuard, FeedStatus, HoldOpen};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::{sleep, Instant};
use tracing::Instrument;

use crate::abort::AbortOnDrop;
use crate::backoff::Backoff;
use crate::changes::Hooks;
use crate::column;
use crate::pg_copy::PgCopySource;
use crate::pg_feed::{self, Read};
use crate::pg_snapshot::{self, BuildLock, Stored};
use crate::watch::Watch;

/// The `application_name` of the listener's connection, to find it in
/// `pg_stat_activity`.
pub const LISTENER_APPLICATION_NAME: &str = "bloom-guard-listener";

/// The channel the feed's triggers NOTIFY, with the feed's name as payload.
const CHANNEL: &str = "bloom_guard";

/// Keeps a guard's filter complete while the database changes, whatever
/// writes to it: every instance, `psql`, COPY, upserts, replication.
///
/// It reads the change feed that [`install`](crate::install) and
/// [`Watch::install`] put in the database: triggers record every new key in
/// `bloom_guard.changes` in the writing transaction, and
/// [`run`](Self::run) does the rest, for as long as it runs:
///
/// 1. **Position first.** It takes the feed's position (a snapshot), then
///    warms the guard up: the warm-up's scan sees every key committed
///    before it, the feed every key committed after the position.
/// 2. **Read.** Each read takes the changes committed since the last one,
///    by snapshot visibility (never by id, so a transaction that commits
///    late is not skipped), and inserts the new keys into the filter in use
///    and into any filter being built. Reads happen on every NOTIFY
///    wake-up (on a connection of its own) and every
///    [`poll_interval`](Self::poll_interval); wake-ups are coalesced, and
///    after a read that found nothing the next waits
///    [`min_read_gap`](Self::min_read_gap), so a NOTIFY flood from any role
///    costs at most one cheap read per gap. NOTIFY carries no
///    key: nothing can be injected, nothing is lost with the listener.
/// 3. **Check.** Every [`check_interval`](Self::check_interval)
///    it verifies that every table the key query reads (children and
///    partitions included) has the feed's triggers, ENABLE ALWAYS. A gap
///    fails the guard open, names the table in the log and
///    [`Stats::last_error`](bloom_guard::Stats::last_error); once it is
///    repaired, a full rebuild picks up what was written meanwhile.
/// 4. **Share.** With [`snapshots`](Self::snapshots) (the default) the
///    first filter is the newest snapshot in `bloom_guard.snapshots`,
///    completed by replaying the feed from the position it records; with
///    none usable, instances scan one at a time under the guard's advisory
///    lock and publish, so a fleet starting together scans once.
/// 5. **Maintain.** Rebuilds on the guard's schedule and when inserts
///    outgrow the filter (with snapshots: on the one instance that gets
///    the lock, the others adopt its snapshot), and prunes the feed past its
///    [`retention`](Self::retention) (one instance at a time). A reader
///    whose position fell behind the pruned horizon fails open and rebuilds.
///
/// Deleted and changed-away keys go to [`on_key`](Self::on_key) too (for
/// cache invalidation); the filter keeps them until a rebuild.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{PgFollower, Watch};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// bloom_guard_sqlx::install(&pool).await?; // at migration time
/// items.install(&pool).await?;
///
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(PgFollower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
pub struct PgFollower {
    guard: BloomGuard,
    pool: PgPool,
    watch: Watch,
    poll_interval: Duration,
    min_read_gap: Duration,
    check_interval: Duration,
    retention: Duration,
    snapshots: bool,
    snapshot_interval: Duration,
    hooks: Hooks,
    fleet: std::sync::Mutex<Fleet>,
}

/// What the follower knows of the fleet's snapshots.
#[derive(Debug, Default)]
struct Fleet {
    /// The key query's fingerprint, once known.
    fingerprint: Option<String>,
    /// The feed position of the last read: every key committed before it
    /// is in the filter.
    position: Option<String>,
    /// When the scan that the filter in use descends from started (µs,
    /// the database's clock).
    scanned_at: Option<i64>,
    /// Snapshots refused once, never tried again.
    refused: std::collections::HashSet<i64>,
}

impl std::fmt::Debug for PgFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFollower")
            .field("watch", &self.watch)
            .field("poll_interval", &self.poll_interval)
            .field("min_read_gap", &self.min_read_gap)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl PgFollower {
    /// A follower for `guard`, holding the keys of `watch`'s table, reading
    /// through `pool`.
    pub fn new(guard: BloomGuard, pool: PgPool, watch: Watch) -> Self {
        Self {
            guard,
            pool,
            watch,
            poll_interval: Duration::from_secs(1),
            min_read_gap: Duration::from_millis(50),
            check_interval: Duration::from_secs(10),
            retention: Duration::from_secs(3600),
            snapshots: true,
            snapshot_interval: Duration::from_secs(600),
            hooks: Hooks::default(),
            fleet: std::sync::Mutex::default(),
        }
    }

    /// Whether the guard's filter is shared through snapshots in the
    /// database (default on): at start the newest snapshot is adopted and
    /// completed from the feed instead of scanning; scans run on one
    /// instance of the fleet at a time, which publishes the result for the
    /// others. Off, every instance scans at start and on its own schedule.
    ///
    /// Snapshots hold the filter's secret hasher seed in
    /// `bloom_guard.snapshots`: only the service's role should read that
    /// table.
    #[must_use]
    pub fn snapshots(mut self, enabled: bool) -> Self {
        self.snapshots = enabled;
        self
    }

    /// The newest snapshot is republished from the filter in use when it
    /// is older than this (default 10 min), by one instance, so that an
    /// instance starting later replays little of the feed. Keep it well
    /// under the [`retention`](Self::retention): a snapshot older than the
    /// feed's pruned horizon is refused.
    #[must_use]
    pub fn snapshot_interval(mut self, every: Duration) -> Self {
        self.snapshot_interval = every;
        self
    }

    /// How often the feed is read without a wake-up (default 1 s): the
    /// longest a committed key takes to arrive while the listener is down.
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// The pause after a read that found no changes (default 50 ms):
    /// wake-ups that arrive meanwhile are served by one read, so a NOTIFY
    /// flood costs at most one read per pause. A read that found changes
    /// (real writes) is followed at once.
    #[must_use]
    pub fn min_read_gap(mut self, gap: Duration) -> Self {
        self.min_read_gap = gap;
        self
    }

    /// How often the feed's triggers are checked, the feed pruned and the
    /// guard's rebuild schedule looked at (default 10 s).
    #[must_use]
    pub fn check_interval(mut self, every: Duration) -> Self {
        self.check_interval = every;
        self
    }

    /// How long the feed keeps its rows (default 1 h): an instance that
    /// cannot read for longer rebuilds (failing open meanwhile) instead of
    /// catching up from the feed. Scans must also take less than this.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Called with each key the feed reports added, deleted or changed
    /// away, after new keys are in the guard: drop the key's cache entry
    /// here.
    #[must_use]
    pub fn on_key(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.hooks.on_key = Some(Arc::new(hook));
        self
    }

    /// Called when changes arrive that name no key one by one (a table was
    /// truncated, a bulk delete, a rebuild after the feed's retention):
    /// drop every cache entry here.
    #[must_use]
    pub fn on_catch_up(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.on_catch_up = Some(Arc::new(hook));
        self
    }

    /// Warms the guard up and keeps it complete; runs until dropped. Spawn it.
    pub async fn run(self) {
        self.run_until(std::future::pending()).await;
    }

    /// As [`run`](Self::run), until `shutdown` completes; then closes the
    /// listener's connection cleanly and returns.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        let span = tracing::info_span!(
            "bloom_guard_follower",
            guard = self.guard.name(),
            feed = self.watch.feed_name()
        );
        self.follow_until(shutdown).instrument(span).await;
    }

    async fn follow_until(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let this = Arc::new(self);
        let wake = Arc::new(Notify::new());
        let resync = Arc::new(Notify::new());
        let published = Arc::new(Notify::new());
        let (stop_listener, listener_stopped) = tokio::sync::watch::channel(false);
        let wake_ups = WakeUps {
            feed: Arc::clone(&wake),
            published: Arc::clone(&published),
            guard: this.guard.name().to_owned(),
        };
        let listener = tokio::spawn(
            listen(this.listener_options(), wake_ups, listener_stopped).in_current_span(),
        );
        let started = tokio::select! {
            () = &mut shutdown => None,
            started = this.start() => Some(started),
        };
        if let Some((source, position, scanned_at)) = started {
            // A key type that does not fit its column never lets the guard
            // answer, for as long as the follower runs.
            let _key_type = this.check_key_type().await;
            // Before the warm-up: with a gap, the guard's first filter
            // comes already held open.
            let mut gap = None;
            this.check(&source, &mut gap).await;
            let first = Arc::clone(&this).first_filter(source.clone(), scanned_at);
            let _warm_up = AbortOnDrop(tokio::spawn(first.in_current_span()));
            let maintenance = Arc::clone(&this).maintain(
                source.clone(),
                Arc::clone(&resync),
                Arc::clone(&published),
                gap,
            );
            let _maintenance = AbortOnDrop(tokio::spawn(maintenance.in_current_span()));
            tokio::select! {
                () = &mut shutdown => {}
                () = this.follow(&source, position, &wake, &resync) => {}
            }
        }
        let _ = stop_listener.send(true);
        let _ = listener.await;
        tracing::info!(
            feed = this.watch.feed_name(),
            "stopped following the change feed"
        );
    }

    /// The key source and the feed's position (with the database's clock),
    /// taken before the warm-up starts: the warm-up's scan has every key
    /// committed before its snapshot, the feed every key committed after
    /// the position.
    async fn start(&self) -> (PgCopySource, String, i64) {
        let mut backoff = Backoff::default();
        let (query, (position, scanned_at)) = loop {
            let attempt = async {
                let query = self.watch.key_query(&self.pool).await?;
                let fingerprint = pg_snapshot::fingerprint(&self.pool, &query).await?;
                lock(&self.fleet).fingerprint = Some(fingerprint);
                let position = pg_snapshot::position_now(&self.pool).await?;
                Ok::<_, crate::FeedError>((query, position))
            };
            match attempt.await {
                Ok(started) => break started,
                Err(error) => {
                    let pause = backoff.next_pause();
                    tracing::warn!(error = %error_chain(&error), retry_in = ?pause, "cannot start following the change feed; the guard lets every request through");
                    self.guard.report_unavailable(&error);
                    sleep(pause).await;
                }
            }
        };
        (
            PgCopySource::new(self.pool.clone(), query),
            position,
            scanned_at,
        )
    }

    /// The guard's first filter: the newest usable snapshot, completed from
    /// the feed; else a scan, one instance of the fleet at a time, whose
    /// result is published for the others.
    async fn first_filter(self: Arc<Self>, source: PgCopySource, scanned_at: i64) {
        if !self.snapshots {
            self.guard.clone().warm(source).await;
            lock(&self.fleet).scanned_at = Some(scanned_at);
            return;
        }
        if self.adopt_newest(|_| true).await {
            return;
        }
        // Instances starting together queue here: the first scans and
        // publishes, the others adopt what it published.
        let build_lock = match BuildLock::acquire(&self.pool, self.guard.name()).await {
            Ok(build_lock) => Some(build_lock),
            Err(error) => {
                tracing::debug!(%error, "cannot take the fleet's build lock; scanning without it");
                None
            }
        };
        if build_lock.is_some() && self.adopt_newest(|_| true).await {
            if let Some(build_lock) = build_lock {
                build_lock.release().await;
            }
            return;
        }
        // A position taken after the lock: the scan that follows has every
        // key committed before it, so the snapshot's replay starts late.
        let (position, scanned_at) = pg_snapshot::position_now(&self.pool)
            .await
            .map_or((None, scanned_at), |(position, at)| (Some(position), at));
        self.guard.clone().warm(source).await;
        lock(&self.fleet).scanned_at = Some(scanned_at);
        if let Some(position) = position {
            self.publish(&position, scanned_at).await;
        }
        if let Some(build_lock) = build_lock {
            build_lock.release().await;
        }
    }

    /// Adopts the newest snapshot if `wanted` says so and it was not
    /// refused before; false if there is none, or it is refused now.
    async fn adopt_newest(&self, wanted: impl Fn(&Stored) -> bool) -> bool {
        let name = self.guard.name();
        let Some(fingerprint) = lock(&self.fleet).fingerprint.clone() else {
            return false;
        };
        let stored = match pg_snapshot::newest(&self.pool, name, &fingerprint).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return false,
            Err(error) => {
                tracing::debug!(%error, "cannot list the filter's snapshots");
                return false;
            }
        };
        if !wanted(&stored) || lock(&self.fleet).refused.contains(&stored.id) {
            return false;
        }
        let started = Instant::now();
        let refuse = |why: &dyn std::fmt::Display| {
            tracing::warn!(snapshot = stored.id, why = %why, "refusing the filter's snapshot; scanning instead");
            lock(&self.fleet).refused.insert(stored.id);
            false
        };
        let snapshot = match pg_snapshot::load(&self.pool, &stored).await {
            Ok(snapshot) => snapshot,
            Err(pg_snapshot::LoadError::Snapshot(error)) => return refuse(&error),
            Err(error) => {
                tracing::debug!(%error, "cannot load the filter's snapshot");
                return false;
            }
        };
        let loaded = started.elapsed();
        let position = snapshot.info().position.clone();
        let feed = self.watch.feed_name();
        let catch_up = async {
            match pg_feed::read_since(&self.pool, feed, &position).await? {
                Read::Pruned => Err(CatchUpError::Pruned),
                Read::Changes { changes, .. } if changes.resync => Err(CatchUpError::Resync),
                Read::Changes { changes, .. } => {
                    self.hooks.apply(&self.guard, feed, &changes);
                    Ok(())
                }
            }
        };
        match self.guard.adopt(snapshot, &fingerprint, catch_up).await {
            Ok(_) => {
                lock(&self.fleet).scanned_at = Some(stored.scanned_at);
                tracing::info!(
                    snapshot = stored.id,
                    bytes = stored.len,
                    load_ms = loaded.as_millis() as u64,
                    total_ms = started.elapsed().as_millis() as u64,
                    "adopted the filter's snapshot and replayed the feed since"
                );
                true
            }
            Err(bloom_guard::AdoptError::CatchUp(error))
                if error
                    .downcast_ref::<CatchUpError>()
                    .is_some_and(CatchUpError::is_transient) =>
            {
                tracing::debug!(%error, "cannot replay the feed since the snapshot");
                false
            }
            Err(error) => refuse(&error_chain(&error)),
        }
    }

    /// Publishes the filter in use as the guard's newest snapshot, at the
    /// feed `position` (every key committed before it is in the filter).
    async fn publish(&self, position: &str, scanned_at: i64) {
        let Some(fingerprint) = lock(&self.fleet).fingerprint.clone() else {
            return;
        };
        pg_snapshot::publish_filter(&self.pool, &self.guard, &fingerprint, position, scanned_at)
            .await;
    }

    /// A rebuild the guard asked for, once for the fleet: the instance that
    /// gets the build lock scans and publishes, the others adopt that.
    async fn fleet_rebuild(&self, source: &PgCopySource, reason: &str) {
        let name = self.guard.name();
        let build_lock = match BuildLock::try_acquire(&self.pool, name).await {
            Ok(Some(build_lock)) => build_lock,
            Ok(None) => {
                tracing::debug!(reason, "another instance is rebuilding the filter; adopting its snapshot when it is published");
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot take the fleet's build lock");
                return;
            }
        };
        if !self.adopt_newer().await {
            tracing::info!(reason, "rebuilding the bloom filter for the fleet");
            if let Ok((position, scanned_at)) = pg_snapshot::position_now(&self.pool).await {
                if self
                    .guard
                    .rebuild_newer_than(source, Instant::now())
                    .await
                    .is_ok()
                {
                    lock(&self.fleet).scanned_at = Some(scanned_at);
                    self.publish(&position, scanned_at).await;
                }
            }
        }
        build_lock.release().await;
    }

    /// Adopts a snapshot from a scan newer than the one the filter in use
    /// descends from: another instance rebuilt.
    async fn adopt_newer(&self) -> bool {
        let Some(ours) = lock(&self.fleet).scanned_at else {
            return false;
        };
        self.adopt_newest(|stored| stored.scanned_at > ours).await
    }

    /// Republishes the filter in use when the newest snapshot is older than
    /// the interval, on one instance.
    async fn republish_if_stale(&self) {
        let (fingerprint, position, scanned_at) = {
            let fleet = lock(&self.fleet);
            match (&fleet.fingerprint, &fleet.position, fleet.scanned_at) {
                (Some(f), Some(p), Some(s)) => (f.clone(), p.clone(), s),
                _ => return,
            }
        };
        let name = self.guard.name();
        let fresh = match pg_snapshot::newest(&self.pool, name, &fingerprint).await {
            Ok(newest) => {
                newest.is_some_and(|stored| stored.age_secs < self.snapshot_interval.as_secs_f64())
            }
            Err(_) => return,
        };
        if fresh {
            return;
        }
        if let Ok(Some(build_lock)) = BuildLock::try_acquire(&self.pool, name).await {
            self.publish(&position, scanned_at).await;
            build_lock.release().await;
        }
    }

    /// Reads the feed on every wake-up and interval, forever.
    async fn follow(
        &self,
        source: &PgCopySource,
        mut position: String,
        wake: &Notify,
        resync: &Notify,
    ) {
        let name = self.watch.feed_name();
        let mut total = 0;
        let mut failing = false;
        let mut backoff = Backoff::default();
        loop {
            match pg_feed::read_since(&self.pool, name, &position).await {
                Ok(Read::Changes {
                    position: reached,
                    changes,
                }) => {
                    if failing {
                        tracing::info!(feed = name, "reading the change feed again");
                        failing = false;
                    }
                    backoff = Backoff::default();
                    total += changes.rows;
                    position = reached;
                    lock(&self.fleet).position = Some(position.clone());
                    self.hooks.apply(&self.guard, name, &changes);
                    if changes.resync {
                        tracing::info!(feed = name, "the feed's triggers were (re)installed; rebuilding to include keys written without them");
                        resync.notify_one();
                    }
                    self.guard
                        .record_feed_read(FeedStatus::new(&position, total));
                    // A wake-up that found nothing may be anyone's NOTIFY:
                    // the next read waits out the gap. Real writes always
                    // bring rows, so they never wait.
                    if changes.rows == 0 {
                        sleep(self.min_read_gap).await;
                    }
                }
                Ok(Read::Pruned) => {
                    position = self.catch_up_after_pruning(source).await;
                    continue;
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(feed = name, %error, "cannot read the change feed; retrying (keys committed meanwhile arrive once it is back)");
                        failing = true;
                    }
                    // Never longer than the interval: the feed holds what
                    // committed meanwhile, and the sooner it is read the
                    // sooner other instances' keys arrive.
                    sleep(backoff.next_pause().min(self.poll_interval)).await;
                    continue;
                }
            }
            tokio::select! {
                () = wake.notified() => {}
                () = sleep(self.poll_interval) => {}
            }
        }
    }

    /// The feed no longer holds every change since `position`: fails open,
    /// rebuilds from a scan newer than a new position, and resumes there.
    async fn catch_up_after_pruning(&self, source: &PgCopySource) -> String {
        tracing::warn!(feed = self.watch.feed_name(), "the change feed was pruned past this reader's position; rebuilding, the guard lets every request through meanwhile");
        let _hold = self.guard.hold_open();
        self.hooks.catch_up();
        let mut backoff = Backoff::default();
        loop {
            let position = match pg_feed::position(&self.pool).await {
                Ok(position) => position,
                Err(_) => {
                    sleep(backoff.next_pause()).await;
                    continue;
                }
            };
            // Only a rebuild that starts after the position was taken scans
            // every row committed before it.
            let since = Instant::now();
            if self.guard.rebuild_newer_than(source, since).await.is_ok() {
                return position;
            }
            sleep(backoff.next_pause()).await;
        }
    }

    /// Checks the triggers, prunes the feed, and rebuilds when due.
    async fn maintain(
        self: Arc<Self>,
        source: PgCopySource,
        resync: Arc<Notify>,
        published: Arc<Notify>,
        mut gap: Option<HoldOpen>,
    ) {
        let name = self.watch.feed_name();
        let mut ticks = tokio::time::interval(self.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune: Option<Instant> = None;
        loop {
            let resync_requested = tokio::select! {
                _ = ticks.tick() => false,
                () = resync.notified() => true,
                () = published.notified() => {
                    // Anyone may NOTIFY: one look per second at most.
                    if self.snapshots && gap.is_none() {
                        self.adopt_newer().await;
                    }
                    sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.check(&source, &mut gap).await;
            if resync_requested && gap.is_none() {
                let _ = self.guard.rebuild_newer_than(&source, Instant::now()).await;
            }
            if last_prune.is_none_or(|at| at.elapsed() >= self.retention.min(PRUNE_EVERY)) {
                match pg_feed::prune(&self.pool, self.retention).await {
                    Ok(0) => {}
                    Ok(pruned) => tracing::debug!(feed = name, pruned, "pruned the change feed"),
                    Err(error) => tracing::debug!(%error, "cannot prune the change feed"),
                }
                last_prune = Some(Instant::now());
            }
            if self.snapshots && gap.is_none() {
                self.adopt_newer().await;
                self.republish_if_stale().await;
            }
            if let Some(reason) = self.guard.rebuild_due() {
                if self.snapshots {
                    self.fleet_rebuild(&source, reason).await;
                } else {
                    tracing::info!(feed = name, reason, "rebuilding the bloom filter");
                    let _ = self.guard.rebuild(&source).await;
                }
            }
        }
    }

    /// Holds the guard open if its key type could refuse a key stored in
    /// the watched column(s).
    async fn check_key_type(&self) -> Option<HoldOpen> {
        match column::postgres_columns(&self.pool, &self.watch).await {
            Ok(columns) => column::enforce(&self.guard, &self.watch, &columns),
            Err(error) => {
                tracing::warn!(%error, "cannot read the watched key columns' types");
                None
            }
        }
    }

    /// Fails the guard open while a watched table can take writes the
    /// feed does not see; after the repair, rebuilds before closing again.
    async fn check(&self, source: &PgCopySource, gap: &mut Option<HoldOpen>) {
        let name = self.watch.feed_name();
        let gaps = match pg_feed::gaps(&self.pool, name).await {
            Ok(gaps) => gaps,
            Err(sqlx::Error::Database(error))
                if error
                    .code()
                    .is_some_and(|code| code == "42P01" || code == "42883" || code == "3F000") =>
            {
                vec![format!("the change feed is not installed ({error}): call bloom_guard_sqlx::install and Watch::install")]
            }
            Err(error) => {
                tracing::debug!(%error, "cannot check the change feed's triggers");
                return;
            }
        };
        if gaps.is_empty() {
            if gap.is_some() {
                tracing::info!(feed = name, "the change feed's triggers are back; rebuilding before answering absent keys again");
                if self
                    .guard
                    .rebuild_newer_than(source, Instant::now())
                    .await
                    .is_ok()
                {
                    *gap = None;
                    tracing::info!(
                        feed = name,
                        "rebuilt after the repair; the guard answers absent keys again"
                    );
                }
            }
            return;
        }
        let problem = GapError(gaps.join("; "));
        if gap.is_none() {
            tracing::error!(feed = name, gaps = %problem.0, "writes to a watched table can bypass the change feed; the guard lets every request through until this is repaired (run Watch::install or select bloom_guard.watch(...) again)");
            *gap = Some(self.guard.hold_open());
        }
        self.guard.report_unavailable(&problem);
    }

    /// The listener's connection: named so operators can find it, with TCP
    /// keepalives from the server's side (Postgres drops the backend of a
    /// listener whose host vanished). A listener that is silently gone
    /// costs only latency: the feed is also read on an interval.
    fn listener_options(&self) -> PgConnectOptions {
        (*self.pool.connect_options())
            .clone()
            .application_name(LISTENER_APPLICATION_NAME)
            .options([
                ("tcp_keepalives_idle", "30"),
                ("tcp_keepalives_interval", "10"),
                ("tcp_keepalives_count", "3"),
            ])
    }
}

/// What the listener wakes: the feed's reader on every notification, the
/// maintenance when a snapshot of the guard may have been published.
struct WakeUps {
    feed: Arc<Notify>,
    published: Arc<Notify>,
    guard: String,
}

/// Why the feed could not complete a snapshot.
#[derive(Debug, thiserror::Error)]
enum CatchUpError {
    #[error("the snapshot is older than the change feed's pruned horizon")]
    Pruned,
    #[error("the feed's triggers were reinstalled after the snapshot: it may lack keys written without them")]
    Resync,
    #[error("cannot read the change feed")]
    Database(#[from] sqlx::Error),
}

impl CatchUpError {
    fn is_transient(&self) -> bool {
        matches!(self, CatchUpError::Database(_))
    }
}

/// Locks the follower's view of the fleet.
fn lock(fleet: &std::sync::Mutex<Fleet>) -> std::sync::MutexGuard<'_, Fleet> {
    fleet
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How often the feed is pruned at most.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Watched tables whose writes can bypass the feed.
#[derive(Debug, thiserror::Error)]
#[error("writes can bypass the change feed: {0}")]
struct GapError(String);

/// `error: cause: cause`, for a log line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// LISTENs for wake-ups until `stopped`, reconnecting with backoff. A wake-up
/// carries nothing but "read now"; after a reconnect one read catches up.
async fn listen(
    options: PgConnectOptions,
    wake_ups: WakeUps,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let wake = &wake_ups.feed;
    let mut backoff = Backoff::default();
    let mut lost = false;
    loop {
        // A pool of one connection, fresh each time: a half-open connection
        // is dropped with its pool, never handed out again.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(options.clone());
        let session = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.ignore_pool_close_event(true);
            listener.eager_reconnect(false);
            listener.listen(CHANNEL).await?;
            if lost {
                tracing::info!("listening for change feed wake-ups again");
            }
            wake.notify_one();
            loop {
                match listener.try_recv().await? {
                    Some(notification) => {
                        wake.notify_one();
                        if notification.payload() == wake_ups.guard {
                            wake_ups.published.notify_one();
                        }
                    }
                    None => return Ok::<(), sqlx::Error>(()),
                }
            }
        };
        let outcome = tokio::select! {
            _ = stopped.wait_for(|stopped| *stopped) => None,
            outcome = session => Some(outcome),
        };
        pool.close().await;
        let Some(outcome) = outcome else {
            return;
        };
        if !lost {
            match outcome {
                Ok(()) => tracing::warn!("the listener's connection closed; reading the change feed on its interval until it is back"),
                Err(error) => tracing::warn!(%error, "the listener failed; reading the change feed on its interval until it is back"),
            }
            lost = true;
        }
        tokio::select! {
            _ = stopped.wait_for(|stopped| *stopped) => return,
            () = sleep(backoff.next_pause()) => {}
        }
    }
}
