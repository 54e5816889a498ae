//! The follower engine's Postgres backend over the trigger feed: the
//! engine's contract by role, each over the files that do the work.

use std::time::Duration;

use bloom_guard::{BloomGuard, KeyType};
use sqlx::{PgPool, Postgres};
use tokio_util::sync::CancellationToken;

use super::position::PgPosition;
use super::store::{fleet, snapshot};
use super::{catalog, feed, install, notifier, replica, session, wake, CopySource};
use crate::follow::column::KeyColumn;
use crate::follow::{
    BackendError, Catalog, Checks, Clock, Database, FeedReads, FeedUpkeep, KeySet, Read, Scans,
    Stores, WakeUps, Wakes,
};
use crate::source::query::any_key_where;
use crate::store::fleet::FleetTables;
use crate::store::snapshots::Tables;
use crate::watch::Watch;

/// A Postgres database holding a watched table and its change feed.
#[derive(Debug, Clone)]
pub(crate) struct PgBackend {
    pub(crate) pool: PgPool,
    /// The connection feed reads go through.
    pub(crate) feed: std::sync::Arc<crate::kept::KeptConnection<sqlx::PgConnection>>,
    pub(crate) watch: Watch,
    snapshots: Tables<Postgres>,
    fleet: FleetTables<Postgres>,
    /// How often the elected notifier looks for new changes.
    pub(super) notify_interval: Duration,
    /// Stored keys with characters other than ASCII are read as the
    /// database lowers them (a case-insensitive guard: over `citext`, the
    /// form the database compares).
    pub(crate) lowered: bool,
    /// A replica feed reads go to, if any.
    pub(super) replica: Option<replica::Replica>,
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

    async fn key_source(&self) -> Result<KeySet<CopySource>, BackendError> {
        // A scan placed by the triggers' positions would not meet the log
        // feed's rows at its point.
        if install::published(&self.pool, &self.watch.table).await? {
            return Err(BackendError::OnTheLogFeed(self.watch.table.clone()));
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

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        Ok(catalog::key_columns(&self.pool, &self.watch).await?)
    }

    async fn has_unsafe_keys(&self, source: &CopySource) -> Result<bool, BackendError> {
        Ok(any_key_where(
            &self.pool,
            source.query(),
            r#"(k.key collate pg_catalog."C") ~ '[^\t-\r -~]'"#,
        )
        .await?)
    }
}

impl FeedReads for PgBackend {
    type Position = PgPosition;

    fn parse_position(text: &str) -> Option<PgPosition> {
        PgPosition::parse(text)
    }

    async fn position(&self) -> Result<Clock<PgPosition>, BackendError> {
        Ok(snapshot::position_now(&self.pool).await?)
    }

    async fn read(&self, since: &PgPosition) -> Result<Read<PgPosition>, BackendError> {
        let mut read = self.read_feeds(&[self.feed_read(since)]).await?;
        Ok(read.pop().ok_or(sqlx::Error::RowNotFound)?)
    }

    async fn read_behind(&self, since: &PgPosition) -> Result<Read<PgPosition>, BackendError> {
        Ok(feed::read_kept_behind(&self.feed, self.feed_read(since)).await?)
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
    ) -> Result<Vec<Read<PgPosition>>, BackendError> {
        let Some((first, _)) = reads.first() else {
            return Ok(Vec::new());
        };
        let feeds: Vec<_> = reads
            .iter()
            .map(|(backend, since)| backend.feed_read(since))
            .collect();
        Ok(first.read_feeds(&feeds).await?)
    }
}

impl FeedUpkeep for PgBackend {
    async fn pending(&self, since: &PgPosition, limit: u64) -> Result<u64, BackendError> {
        Ok(feed::pending(&self.pool, self.watch.feed_name(), since, limit).await?)
    }

    async fn prune(&self, retention: Duration) -> Result<i64, BackendError> {
        Ok(feed::prune(&self.pool, retention).await?)
    }

    async fn storage(
        &self,
        retention: Duration,
    ) -> Result<Option<bloom_guard::stats::FeedStorage>, BackendError> {
        Ok(feed::storage(&self.pool, retention).await.map(Some)?)
    }
}

impl Checks for PgBackend {
    async fn check_session(&self) -> Result<(), crate::error::FeedError> {
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

    async fn counts_rows(&self) -> Result<bool, BackendError> {
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
            counts => Ok(counts?),
        }
    }

    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        Ok(catalog::gaps(&self.pool, &self.watch).await?)
    }

    async fn repair(&self) -> Result<bool, BackendError> {
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
        self.watch.watch_once(&self.pool).await?;
        Ok(true)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        Ok(catalog::trigger_versions(&self.pool, &self.watch).await?)
    }

    async fn catalog(&self) -> Result<Catalog, BackendError> {
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

    async fn lock(&self, guard: &str) -> Result<Self::Lock, BackendError> {
        Ok(snapshot::build_lock(&self.pool, guard).await?)
    }

    async fn try_lock(&self, guard: &str) -> Result<Option<Self::Lock>, BackendError> {
        Ok(snapshot::try_build_lock(&self.pool, guard).await?)
    }
}
