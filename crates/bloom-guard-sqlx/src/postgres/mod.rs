//! Postgres: the feed's schema ([`install`], [`uninstall`], [`SQL`]), the
//! [`Follower`] of a table on the trigger feed, the [`CopySource`] a warm-up
//! scans, the servers of a multi-host URL ([`Servers`]), and the log feed
//! ([`log`], feature `log-feed`).
//!
//! Inside: the follower engine's Postgres backend: the feed read by
//! snapshot visibility, LISTEN wake-ups, the trigger check, snapshots
//! under an advisory lock, the feed's SQL, and the COPY warm-up.

mod catalog;
mod connections;
mod feed;
mod install;
#[cfg(feature = "log-feed")]
pub mod log;
mod notifier;
mod position;
mod privileges;
mod replica;
mod scan;
pub(crate) mod servers;
mod session;
pub(crate) mod store;
mod uninstall;
mod wake;
mod watch;

use std::time::Duration;

use bloom_guard::{BloomGuard, KeyType};
use sqlx::{PgPool, Postgres};
use tokio_util::sync::CancellationToken;

pub use connections::warm_pool;
pub use feed::FEED_APPLICATION_NAME;
pub use install::{install, SCHEMA_VERSION, SQL};
#[cfg(feature = "log-feed")]
pub(crate) use log::PgLogBackend;
pub use notifier::NOTIFIER_APPLICATION_NAME;
pub use privileges::grant_runtime;
pub use scan::CopySource;
pub use servers::{Servers, ServersError, TargetSession};
pub use session::check_session;
use store::{fleet, snapshot};
pub use uninstall::uninstall;
pub use wake::LISTENER_APPLICATION_NAME;

use crate::follow::column::KeyColumn;
use crate::follow::{
    follower_api, Catalog, Checks, Clock, Database, Engine, FeedReads, FeedUpkeep, KeySet, Read,
    Scans, Stores, WakeUps, Wakes,
};
use crate::source::query::any_key_where;
use crate::store::fleet::FleetTables;
use crate::store::snapshots::Tables;
use crate::watch::Watch;
use position::PgPosition;

#[doc = include_str!("../follow/protocol.md")]
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{postgres, Watch};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// bloom_guard_sqlx::postgres::install(&pool).await?; // at migration time
/// items.install(&pool).await?;
///
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(postgres::Follower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
///
#[doc = include_str!("../../docs/consistency.md")]
pub struct Follower {
    engine: Engine<PgBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower for `guard`, holding the keys of `watch`'s table, reading
    /// through `pool`.
    pub fn new(guard: BloomGuard, pool: PgPool, watch: Watch) -> Self {
        let backend = PgBackend::new(&guard, pool, watch);
        Self {
            engine: Engine::new(guard, backend),
        }
    }

    /// Reads the feed on `replica`, a hot standby of the pool's primary:
    /// feed reads, the read barrier's among them, go to the replica, and
    /// count only once it has replayed past the primary's log position
    /// taken after they were asked for (one trivial statement on the
    /// primary per read, shared as reads are); a replica that has not within
    /// [`replica_lag`](Self::replica_lag) leaves the read to the primary,
    /// so a lagging replica never makes the guard refuse a committed key.
    /// Scans, snapshots, heartbeats, wake-ups and the trigger check stay on
    /// the primary.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use bloom_guard::BloomGuard;
    /// use bloom_guard_sqlx::{postgres, Watch};
    ///
    /// # async fn run(primary: sqlx::PgPool, replica: sqlx::PgPool) {
    /// let guard = BloomGuard::builder().expected_items(1_000_000).build();
    /// let follower = postgres::Follower::new(guard, primary, Watch::table("items").key("key"))
    ///     .replica(replica);
    /// tokio::spawn(follower.run());
    /// # }
    /// ```
    #[must_use]
    pub fn replica(mut self, replica: PgPool) -> Self {
        self.engine.backend.replica = Some(replica::Replica::new(replica));
        self
    }

    /// How long a feed read waits for the [`replica`](Self::replica) to
    /// replay past the primary's position before it reads on the primary
    /// (default 100 ms, within the read barrier's bound).
    #[must_use]
    pub fn replica_lag(mut self, bound: Duration) -> Self {
        if let Some(replica) = &mut self.engine.backend.replica {
            replica.max_lag = bound;
        }
        self
    }

    /// How often the one instance elected to wake the others looks for
    /// newly committed changes (default 10 ms): a change reaches every
    /// instance about this long after its commit. One look is one cheap
    /// query on the primary, from one instance of the whole fleet; the
    /// writers' transactions send nothing.
    #[must_use]
    pub fn notify_interval(mut self, every: Duration) -> Self {
        self.engine.backend.notify_interval = every;
        self
    }

    /// The pause after a read that found no changes (default 50 ms):
    /// wake-ups that arrive meanwhile are served by one read, so a NOTIFY
    /// flood from any role costs at most one read per pause. A read that
    /// found changes (real writes) is followed at once.
    #[must_use]
    pub fn min_read_gap(mut self, gap: Duration) -> Self {
        self.engine.min_read_gap = gap;
        self
    }
}

/// A Postgres database holding a watched table and its change feed.
#[derive(Debug, Clone)]
pub(crate) struct PgBackend {
    pool: PgPool,
    /// The connection feed reads go through.
    feed: std::sync::Arc<crate::kept::KeptConnection<sqlx::PgConnection>>,
    watch: Watch,
    snapshots: Tables<Postgres>,
    fleet: FleetTables<Postgres>,
    /// How often the elected notifier looks for new changes.
    notify_interval: Duration,
    /// Stored keys with characters other than ASCII are read as the
    /// database lowers them (a case-insensitive guard: over `citext`, the
    /// form the database compares).
    lowered: bool,
    /// A replica feed reads go to, if any.
    replica: Option<replica::Replica>,
}

impl PgBackend {
    pub(crate) fn new(guard: &BloomGuard, pool: PgPool, watch: Watch) -> Self {
        let snapshots = Tables::new(&pool, &snapshot::STATEMENTS);
        let fleet = FleetTables::new(&pool, &fleet::STATEMENTS);
        Self {
            feed: std::sync::Arc::new(feed::feed_connection(&pool)),
            pool,
            watch,
            snapshots,
            fleet,
            notify_interval: Duration::from_millis(10),
            lowered: guard.key_type() == KeyType::CaseInsensitiveText,
            replica: None,
        }
    }
}

impl PgBackend {
    /// Reads `feeds` on the replica if there is one, else on the primary.
    async fn read_feeds(
        &self,
        feeds: &[feed::FeedRead<'_>],
    ) -> Result<Vec<Read<PgPosition>>, sqlx::Error> {
        match &self.replica {
            Some(replica) => replica.read(&self.feed, feeds).await,
            None => feed::read_kept(&self.feed, feeds).await,
        }
    }

    /// This follower's feed in a read from `since`.
    fn feed_read<'a>(&'a self, since: &'a PgPosition) -> feed::FeedRead<'a> {
        feed::FeedRead {
            name: self.watch.feed_name(),
            lowered: self.lowered,
            seen: since,
        }
    }
}

impl Database for PgBackend {
    type Stores = Self;

    fn stores(&self) -> &Self {
        self
    }

    fn watch(&self) -> &Watch {
        &self.watch
    }
}

impl Scans for PgBackend {
    type Source = CopySource;

    async fn key_source(&self) -> Result<KeySet<CopySource>, sqlx::Error> {
        // A scan placed by the triggers' positions would not meet the log
        // feed's rows at its point.
        if install::published(&self.pool, &self.watch.table).await? {
            return Err(sqlx::Error::Protocol(format!(
                "{} is on the log feed: follow it with postgres::log::Follower, rebuild it with FleetRebuild::log",
                self.watch.table
            )));
        }
        let query = self.watch.key_query(&self.pool, self.lowered).await?;
        // A snapshot names the tables and triggers it was built under: one
        // from before a table was recreated or a trigger altered is not
        // adopted.
        let trigger_versions = self.trigger_versions().await?;
        let fingerprint = snapshot::fingerprint(&self.pool, &query, &trigger_versions).await?;
        Ok(KeySet {
            source: CopySource::new(self.pool.clone(), query).with_feed_position(),
            fingerprint,
            trigger_versions,
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, sqlx::Error> {
        catalog::key_columns(&self.pool, &self.watch).await
    }

    async fn has_unsafe_keys(&self, source: &CopySource) -> Result<bool, sqlx::Error> {
        any_key_where(
            &self.pool,
            source.query(),
            r#"(k.key collate pg_catalog."C") ~ '[^\t-\r -~]'"#,
        )
        .await
    }
}

impl FeedReads for PgBackend {
    type Position = PgPosition;

    fn parse_position(text: &str) -> Option<PgPosition> {
        PgPosition::parse(text)
    }

    async fn position(&self) -> Result<Clock<PgPosition>, sqlx::Error> {
        snapshot::position_now(&self.pool).await
    }

    async fn read(&self, since: &PgPosition) -> Result<Read<PgPosition>, sqlx::Error> {
        let mut read = self.read_feeds(&[self.feed_read(since)]).await?;
        read.pop().ok_or(sqlx::Error::RowNotFound)
    }

    async fn read_behind(&self, since: &PgPosition) -> Result<Read<PgPosition>, sqlx::Error> {
        feed::read_kept_behind(&self.feed, self.feed_read(since)).await
    }

    fn shared_reads(&self) -> Option<String> {
        let name = |options: &sqlx::postgres::PgConnectOptions| {
            format!(
                "postgres://{}@{}:{}/{} {:?}",
                options.get_username(),
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or_default(),
                options.get_socket(),
            )
        };
        let primary = name(&self.pool.connect_options());
        Some(match &self.replica {
            Some(replica) => format!(
                "{primary} replica {}",
                name(&replica.pool.connect_options())
            ),
            None => primary,
        })
    }

    async fn read_together(
        reads: &[(&Self, &PgPosition)],
    ) -> Result<Vec<Read<PgPosition>>, sqlx::Error> {
        let Some((first, _)) = reads.first() else {
            return Ok(Vec::new());
        };
        let feeds: Vec<_> = reads
            .iter()
            .map(|(backend, since)| backend.feed_read(since))
            .collect();
        first.read_feeds(&feeds).await
    }
}

impl FeedUpkeep for PgBackend {
    async fn pending(&self, since: &PgPosition, limit: u64) -> Result<u64, sqlx::Error> {
        feed::pending(&self.pool, self.watch.feed_name(), since, limit).await
    }

    async fn prune(&self, retention: Duration) -> Result<i64, sqlx::Error> {
        feed::prune(&self.pool, retention).await
    }

    async fn storage(
        &self,
        retention: Duration,
    ) -> Result<Option<bloom_guard::stats::FeedStorage>, sqlx::Error> {
        feed::storage(&self.pool, retention).await.map(Some)
    }
}

impl Checks for PgBackend {
    async fn check_session(&self) -> Result<(), crate::FeedError> {
        // The feed reads' own connection opens meanwhile: the start's
        // first read follows at once, and over TLS a connection costs a
        // handshake. Not opened is no error here: that read reports it.
        let open_feed = async {
            if let Ok(lease) = self.feed.lease().await {
                lease.keep();
            }
        };
        tokio::join!(session::check_session(&self.pool), open_feed).0
    }

    async fn counts_rows(&self) -> Result<bool, sqlx::Error> {
        let counts = sqlx::query_scalar("select bloom_guard.counts_rows($1)")
            .bind(self.watch.feed_name())
            .fetch_one(&self.pool)
            .await;
        match counts {
            // A feed of a version before 7 (no such function, or no such
            // schema yet): its functions do not count rows.
            Err(sqlx::Error::Database(error))
                if matches!(error.code().as_deref(), Some("42883" | "3F000")) =>
            {
                Ok(false)
            }
            counts => counts,
        }
    }

    async fn gaps(&self) -> Result<Vec<String>, sqlx::Error> {
        catalog::gaps(&self.pool, &self.watch).await
    }

    async fn repair(&self) -> Result<bool, sqlx::Error> {
        // Only a table the feed does not watch: triggers a DBA disabled stay
        // as they are (a bulk load), reported until enabled again.
        if catalog::unwatched_table(&self.pool, &self.watch)
            .await?
            .is_none()
        {
            return Ok(false);
        }
        // One try under the lock timeout: a table an open transaction holds
        // is tried again at the next check, never holding writers back.
        self.watch.watch_once(&self.pool).await.map(|()| true)
    }

    async fn trigger_versions(&self) -> Result<String, sqlx::Error> {
        catalog::trigger_versions(&self.pool, &self.watch).await
    }

    async fn catalog(&self) -> Result<Catalog, sqlx::Error> {
        // One statement; any error (a feed of an earlier version, not
        // installed) and the three ask on their own, each with its answer
        // for that case.
        match catalog::check(&self.pool, &self.watch).await {
            Ok(catalog) => Ok(catalog),
            Err(_) => Ok(Catalog {
                gaps: self.gaps().await?,
                versions: self.trigger_versions().await.ok(),
                counts_rows: self.counts_rows().await.ok(),
            }),
        }
    }
}

impl Wakes for PgBackend {
    fn announces_changes(&self) -> bool {
        true
    }

    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let notify = notifier::shared(self.pool.clone(), self.notify_interval, stop.clone());
        let listen = wake::listen(self.pool.clone(), wake, stop);
        async move {
            tokio::join!(listen, notify);
        }
    }

    async fn close(&self) {
        self.feed.close().await;
        if let Some(replica) = &self.replica {
            replica.close().await;
        }
    }
}

impl Stores for PgBackend {
    type Snapshots = Tables<Postgres>;
    type Fleet = FleetTables<Postgres>;
    type Lock = snapshot::PgBuildLock;

    fn snapshots(&self) -> &Tables<Postgres> {
        &self.snapshots
    }

    fn fleet(&self) -> &FleetTables<Postgres> {
        &self.fleet
    }

    async fn lock(&self, guard: &str) -> Result<Self::Lock, sqlx::Error> {
        snapshot::build_lock(&self.pool, guard).await
    }

    async fn try_lock(&self, guard: &str) -> Result<Option<Self::Lock>, sqlx::Error> {
        snapshot::try_build_lock(&self.pool, guard).await
    }
}
