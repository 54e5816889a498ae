//! MySQL 8 and MariaDB 10.6 or later: the [`Follower`] of a table on the
//! trigger feed, and [`uninstall`] for the feed's tables.
//!
//! Inside: the follower engine's MySQL and MariaDB backend: the feed read by row
//! id with the ids of open transactions kept open, wake-ups by a look at
//! the feed's highest id, the trigger check, snapshots under `GET_LOCK`,
//! the feed's tables and triggers, and the scan.

mod catalog;
mod collation;
mod feed;
mod galera;
mod install;
mod key_type;
#[cfg(feature = "binlog-feed")]
pub mod log;
mod names;
mod position;
mod scan;
mod settle;
mod store;
mod uninstall;
mod wake;
mod watch;

pub use uninstall::uninstall;

use std::sync::Arc;
use std::time::Duration;

use bloom_guard::{BloomGuard, KeyType};
use sqlx::{MySql, MySqlPool};
use tokio_util::sync::CancellationToken;

use crate::follow::column::KeyColumn;
use crate::follow::{
    follower_api, BackendError, Checks, Clock, Database, Engine, FeedReads, FeedUpkeep, KeySet,
    Read, Scans, Stores, WakeUps, Wakes,
};
use crate::store::fleet::FleetTables;
use crate::store::snapshots::Tables;
use crate::watch::Watch;
use position::Cursor;
use scan::MySqlScan;
use settle::Settled;

/// How soon a position with open ids is read again: their commit moves
/// no wake-up (the feed's highest id stays).
const REVISIT: Duration = Duration::from_millis(25);

#[doc = include_str!("../follow/protocol.md")]
///
/// On MySQL and MariaDB the feed is read whenever its highest row id
/// moves (looked at every 10 ms while it does, backing off to once a
/// second at rest), at every refusal's read barrier, and at least every
/// [`poll_interval`](Self::poll_interval). Needs
/// [`Watch::install`] first.
///
#[doc = include_str!("../../docs/mysql.md")]
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{mysql, Watch};
///
/// # async fn run(pool: sqlx::MySqlPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// items.install(&pool).await?;
/// // The key type the column needs: under MariaDB's default collation,
/// // `Apple-Pie` is found as `apple-pie`.
/// let guard = BloomGuard::builder()
///     .key_type(items.key_type(&pool).await?)
///     .build();
/// tokio::spawn(mysql::Follower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
pub struct Follower {
    engine: Engine<MySqlBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower for `guard`, holding the keys of `watch`'s table.
    pub fn new(guard: BloomGuard, pool: MySqlPool, watch: Watch) -> Self {
        let backend = MySqlBackend::new(&guard, pool, watch);
        Self {
            engine: Engine::new(guard, backend),
        }
    }
}

/// A MySQL or MariaDB database holding a watched table and its change feed.
#[derive(Debug, Clone)]
pub(crate) struct MySqlBackend {
    pool: MySqlPool,
    /// The connection feed reads go through.
    feed: Arc<crate::kept::KeptConnection<sqlx::MySqlConnection>>,
    watch: Watch,
    settled: Arc<Settled>,
    snapshots: Tables<MySql>,
    fleet: FleetTables<MySql>,
    /// The collation of a [`KeyType::Collated`] guard: stored keys are
    /// read as the server weighs them under it.
    collation: Option<String>,
    /// Whether the binary log feeds the table (its backend wraps this one).
    #[cfg_attr(not(feature = "binlog-feed"), allow(dead_code))]
    on_the_log: bool,
}

impl MySqlBackend {
    pub(crate) fn new(guard: &BloomGuard, pool: MySqlPool, watch: Watch) -> Self {
        let collation = match guard.key_type() {
            KeyType::Collated(collation) => Some(collation.name().to_owned()),
            _ => None,
        };
        Self {
            collation,
            snapshots: Tables::new(&pool, &store::STATEMENTS),
            fleet: FleetTables::new(&pool, &store::FLEET),
            settled: Arc::default(),
            feed: Arc::new(feed::feed_connection(&pool)),
            pool,
            watch,
            on_the_log: false,
        }
    }
}

impl Database for MySqlBackend {
    type Stores = Self;

    fn stores(&self) -> &Self {
        self
    }

    fn watch(&self) -> &Watch {
        &self.watch
    }
}

impl Scans for MySqlBackend {
    type Source = MySqlScan;

    async fn key_source(&self) -> Result<KeySet<MySqlScan>, BackendError> {
        #[cfg(feature = "binlog-feed")]
        if !self.on_the_log && log::registry::is_logged(&self.pool, &self.watch).await? {
            return Err(BackendError::Feed(
                format!(
                    "{} is on the binary log feed: follow it with mysql::log::Follower, rebuild it with FleetRebuild::mysql_log",
                    self.watch.table
                )
                .into(),
            ));
        }
        let query = self
            .watch
            .mysql_key_query(&self.pool, self.collation.as_deref())
            .await?;
        let identity = install::identity(&self.pool).await?;
        let versions = catalog::trigger_versions(&self.pool, &self.watch).await?;
        Ok(KeySet {
            fingerprint: store::fingerprint(&identity, &query, &versions),
            source: MySqlScan::new(
                self.pool.clone(),
                query,
                Arc::clone(&self.settled),
                self.collation.is_some(),
            ),
            trigger_versions: versions,
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        Ok(key_type::key_columns(&self.pool, &self.watch).await?)
    }

    async fn has_unsafe_keys(&self, source: &MySqlScan) -> Result<bool, BackendError> {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
            "select cast(exists (select 1 from ({}) as q where q.k regexp '[^\\t-\\r -~]') as signed)",
            source.query()
        )))
        .fetch_one(&self.pool)
        .await
        .map(|found| found != 0)
        .map_err(BackendError::from)
    }
}

impl FeedReads for MySqlBackend {
    type Position = Cursor;

    fn revisit(position: &Cursor) -> Option<Duration> {
        (!position.open.is_empty()).then_some(REVISIT)
    }

    fn parse_position(text: &str) -> Option<Cursor> {
        Cursor::parse(text)
    }

    async fn position(&self) -> Result<Clock<Cursor>, BackendError> {
        // A fresh settled id keeps the position's open ids few: settle the
        // ids handed out so far, for about a second at most (a long
        // transaction holds them longer).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            self.settled.round(&self.pool).await;
            if !self.settled.settling() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(REVISIT).await;
        }
        let snapshot = self.settled.snapshot_statement(&self.pool).await?;
        let settled = self.settled.now();
        let mut tx = self.pool.begin_with(snapshot).await?;
        let at: i64 = sqlx::query_scalar("select cast(unix_timestamp(now(6)) * 1000000 as signed)")
            .fetch_one(&mut *tx)
            .await?;
        let position = feed::position_in(&mut tx, settled).await?;
        tx.commit().await?;
        Ok(Clock { position, at })
    }

    async fn read(&self, since: &Cursor) -> Result<Read<Cursor>, BackendError> {
        Ok(feed::read_since(
            &self.feed,
            &self.settled,
            &self.pool,
            self.watch.feed_name(),
            self.collation.as_deref(),
            since,
        )
        .await?)
    }
}

impl FeedUpkeep for MySqlBackend {
    async fn pending(&self, since: &Cursor, limit: u64) -> Result<u64, BackendError> {
        Ok(feed::pending(&self.pool, self.watch.feed_name(), since, limit).await?)
    }

    async fn prune(&self, retention: Duration) -> Result<i64, BackendError> {
        // Settled as of now: without writes that leave ids open, no read
        // moves the method on.
        self.settled.round(&self.pool).await;
        let settled = if self.settled.unlisted() {
            // Without `PROCESS` nothing settles; pruning by age alone keeps
            // the feed bounded, and a transaction open longer than the
            // retention is the one case left unguarded (docs/mysql.md).
            i64::MAX - 1
        } else {
            self.settled.now()
        };
        Ok(feed::prune(&self.pool, settled, retention).await?)
    }
}

impl Checks for MySqlBackend {
    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        let gaps = catalog::gaps(&self.pool, &self.watch).await?;
        Ok(gaps.into_iter().map(|gap| gap.reason).collect())
    }

    async fn repair(&self) -> Result<bool, BackendError> {
        // A table swapped in (an online schema change's copy) has none of
        // the triggers, a rewritten one the wrong ones: this role puts them
        // back if it may, as long as the key columns are there. Other gaps
        // (a replica, a cascading foreign key) wait for a person.
        let gaps = catalog::gaps(&self.pool, &self.watch).await?;
        if !gaps.iter().any(|gap| gap.repairable)
            || !key_type::has_key_columns(&self.pool, &self.watch).await?
        {
            return Ok(false);
        }
        // One try: a table an open transaction holds is tried again at
        // the next check, never holding writers back.
        self.watch
            .install_mysql_once(&self.pool, &std::sync::atomic::AtomicBool::new(false))
            .await?;
        // Every instance rebuilds: writes made without the triggers are in
        // no feed.
        catalog::record_resync(&self.pool, self.watch.feed_name()).await?;
        Ok(true)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        Ok(catalog::trigger_versions(&self.pool, &self.watch).await?)
    }
}

impl Wakes for MySqlBackend {
    fn announces_changes(&self) -> bool {
        true
    }

    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        wake::watch(self.pool.clone(), wake, stop)
    }

    async fn close(&self) {
        self.feed.close().await;
    }
}

impl Stores for MySqlBackend {
    type Snapshots = Tables<MySql>;
    type Fleet = FleetTables<MySql>;
    type Lock = store::MySqlBuildLock;

    fn snapshots(&self) -> &Tables<MySql> {
        &self.snapshots
    }

    fn fleet(&self) -> &FleetTables<MySql> {
        &self.fleet
    }

    async fn lock(&self, guard: &str) -> Result<Self::Lock, BackendError> {
        Ok(store::build_lock(&self.pool, guard).await?)
    }

    async fn try_lock(&self, guard: &str) -> Result<Option<Self::Lock>, BackendError> {
        Ok(store::try_build_lock(&self.pool, guard).await?)
    }
}
