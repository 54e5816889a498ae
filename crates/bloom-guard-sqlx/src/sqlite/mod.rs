//! SQLite: the [`Follower`] of a table on the trigger feed, and
//! [`uninstall`] for the feed's tables.
//!
//! Inside: the follower engine's SQLite backend: the feed read by row id,
//! `PRAGMA data_version` wake-ups, the trigger check, snapshots under a
//! leased lock row, the feed's tables and triggers, and the scan.

mod feed;
mod install;
mod names;
mod position;
mod scan;
mod store;
mod uninstall;
mod wake;
mod watch;

use store::{fleet, snapshot};
pub use uninstall::uninstall;

use std::time::Duration;

use bloom_guard::BloomGuard;
use sqlx::{Sqlite, SqlitePool};
use tokio_util::sync::CancellationToken;

use crate::follow::column::KeyColumn;
use crate::follow::{
    follower_api, BackendError, Checks, Clock, Database, Engine, FeedReads, FeedUpkeep, KeySet,
    Read, Scans, Stores, WakeUps, Wakes,
};
use crate::source::query::any_key_where;
use crate::store::fleet::FleetTables;
use crate::store::snapshots::Tables;
use crate::watch::Watch;
use position::Mark;
use scan::SqliteScan;

#[doc = include_str!("../follow/protocol.md")]
///
/// On SQLite the feed's rows after the position are read whenever
/// `PRAGMA data_version` (on a connection of its own) says another
/// connection committed, and at least every
/// [`poll_interval`](Self::poll_interval). Needs [`Watch::install`]
/// first.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::{sqlite, Watch};
///
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let items = Watch::table("items").key("key");
/// items.install(&pool).await?;
/// let guard = BloomGuard::builder().build();
/// tokio::spawn(sqlite::Follower::new(guard.clone(), pool, items).run());
/// # Ok(()) }
/// ```
pub struct Follower {
    engine: Engine<SqliteBackend>,
}

follower_api!(Follower);

impl Follower {
    /// A follower for `guard`, holding the keys of `watch`'s table.
    pub fn new(guard: BloomGuard, pool: SqlitePool, watch: Watch) -> Self {
        Self {
            engine: Engine::new(guard, SqliteBackend::new(pool, watch)),
        }
    }
}

/// A SQLite database holding a watched table and its change feed.
#[derive(Debug, Clone)]
pub(crate) struct SqliteBackend {
    pool: SqlitePool,
    watch: Watch,
    snapshots: Tables<Sqlite>,
    fleet: FleetTables<Sqlite>,
}

impl SqliteBackend {
    pub(crate) fn new(pool: SqlitePool, watch: Watch) -> Self {
        let snapshots = Tables::new(&pool, &snapshot::STATEMENTS);
        let fleet = FleetTables::new(&pool, &fleet::STATEMENTS);
        Self {
            pool,
            watch,
            snapshots,
            fleet,
        }
    }
}

impl Database for SqliteBackend {
    type Stores = Self;

    fn stores(&self) -> &Self {
        self
    }

    fn watch(&self) -> &Watch {
        &self.watch
    }
}

impl Scans for SqliteBackend {
    type Source = SqliteScan;

    async fn key_source(&self) -> Result<KeySet<SqliteScan>, BackendError> {
        let query = self.watch.sqlite_key_query();
        let identity = install::identity(&self.pool).await?;
        Ok(KeySet {
            fingerprint: snapshot::fingerprint(&identity, &query),
            source: SqliteScan::new(self.pool.clone(), query),
            trigger_versions: String::new(),
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        Ok(feed::key_columns(&self.pool, &self.watch).await?)
    }

    async fn has_unsafe_keys(&self, source: &SqliteScan) -> Result<bool, BackendError> {
        Ok(any_key_where(&self.pool, source.query(), "k.key glob '*[^ -~]*'").await?)
    }
}

impl FeedReads for SqliteBackend {
    type Position = Mark;

    fn parse_position(text: &str) -> Option<Mark> {
        Mark::parse(text)
    }

    async fn position(&self) -> Result<Clock<Mark>, BackendError> {
        let at = snapshot::now_micros();
        let position = feed::position(&self.pool).await?;
        Ok(Clock { position, at })
    }

    async fn read(&self, since: &Mark) -> Result<Read<Mark>, BackendError> {
        Ok(feed::read_since(&self.pool, self.watch.feed_name(), since).await?)
    }
}

impl FeedUpkeep for SqliteBackend {
    async fn pending(&self, since: &Mark, limit: u64) -> Result<u64, BackendError> {
        Ok(feed::pending(&self.pool, self.watch.feed_name(), since, limit).await?)
    }

    async fn prune(&self, retention: Duration) -> Result<i64, BackendError> {
        Ok(feed::prune(&self.pool, retention).await?)
    }
}

impl Checks for SqliteBackend {
    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        Ok(feed::gaps(&self.pool, &self.watch).await?)
    }

    async fn repair(&self) -> Result<bool, BackendError> {
        // A table rebuilt the SQLite way (new table, copy, drop, rename)
        // lost its triggers: any connection may put them back, as long as
        // the key columns are there (triggers naming a missing column
        // would fail every write).
        if feed::gaps(&self.pool, &self.watch).await?.is_empty()
            || !feed::has_key_columns(&self.pool, &self.watch).await?
        {
            return Ok(false);
        }
        match self.watch.install_sqlite(&self.pool).await {
            Ok(()) => {}
            Err(crate::error::FeedError::Database(error)) => return Err(error.into()),
            // A key column rebuilt into one no key type compares: nothing
            // installed, the gap stays (and the guard open).
            Err(error) => {
                tracing::warn!(%error, "cannot put the feed's triggers back");
                return Ok(false);
            }
        }
        // Every instance rebuilds: writes made without the triggers are in
        // no feed.
        feed::record_resync(&self.pool, self.watch.feed_name()).await?;
        Ok(true)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        // SQLite cannot disable a trigger; the trigger check sees drops.
        Ok(String::new())
    }
}

impl Wakes for SqliteBackend {
    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        wake::watch((*self.pool.connect_options()).clone(), wake, stop)
    }
}

impl Stores for SqliteBackend {
    type Snapshots = Tables<Sqlite>;
    type Fleet = FleetTables<Sqlite>;
    type Lock = snapshot::SqliteBuildLock;

    fn snapshots(&self) -> &Tables<Sqlite> {
        &self.snapshots
    }

    fn fleet(&self) -> &FleetTables<Sqlite> {
        &self.fleet
    }

    async fn lock(&self, guard: &str) -> Result<Self::Lock, BackendError> {
        Ok(snapshot::SqliteBuildLock::acquire(&self.pool, guard).await?)
    }

    async fn try_lock(&self, guard: &str) -> Result<Option<Self::Lock>, BackendError> {
        Ok(snapshot::SqliteBuildLock::try_acquire(&self.pool, guard).await?)
    }
}
