//! The follower engine's backend for a table on the binary log feed:
//! positions are points in the log, scans are taken at a snapshot's point,
//! reads wait for the producer (the barrier by log position), and the check
//! looks at the server's log settings and the table's place on the feed
//! instead of triggers. Snapshots, the fleet, locks and the key query are
//! the trigger feed's (`MySqlBackend`).

use std::time::Duration;

use bloom_guard::feed::KeyLookup;
use bloom_guard::KeyType;
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use super::super::catalog;
use super::super::MySqlBackend;
use super::lookup::TableLookup;
use super::position::LogPosition;
use super::scan::LogScan;
use super::{feed, install, registry};
use crate::follow::column::KeyColumn;
use crate::follow::{
    BackendError, Checks, Clock, Database, FeedReads, FeedUpkeep, KeySet, Read, Scans, WakeUps,
    Wakes,
};
use crate::per_database::database_key;
use crate::watch::Watch;

/// The longest a read waits for the producer: the guard's own bound on a
/// refusal's wait (200 ms by default) sends the refusals on before it, and
/// a read that gives up sooner than that would only be tried again.
pub(crate) const BARRIER_BOUND: Duration = Duration::from_secs(1);

/// A table on the binary log feed of a MySQL or MariaDB database.
#[derive(Debug, Clone)]
pub(crate) struct MySqlLogBackend {
    pub(crate) inner: MySqlBackend,
    /// The URL the producer streams the log with.
    url: String,
    /// How long a read waits for the producer.
    pub(crate) bound: Duration,
    /// Whether would-be refusals are confirmed in the table itself.
    pub(crate) look_up: bool,
}

impl MySqlLogBackend {
    pub(crate) fn new(mut inner: MySqlBackend, url: String) -> Self {
        inner.on_the_log = true;
        Self {
            inner,
            url,
            bound: BARRIER_BOUND,
            look_up: true,
        }
    }

    fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    fn database(&self) -> String {
        let options = self.pool().connect_options();
        database_key(
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default(),
            options.get_username(),
        )
    }

    async fn read_from(
        &self,
        since: &LogPosition,
        wait: bool,
    ) -> Result<Read<LogPosition>, BackendError> {
        let mut connection = self.pool().acquire().await?;
        if wait {
            let deadline = tokio::time::Instant::now() + self.bound;
            feed::wait_for_producer(&mut connection, deadline)
                .await
                .map_err(|error| BackendError::Feed(Box::new(error)))?;
        }
        Ok(feed::read_since(
            &mut connection,
            self.inner.watch.feed_name(),
            self.inner.collation.as_deref(),
            since,
        )
        .await?)
    }
}

impl Database for MySqlLogBackend {
    type Stores = MySqlBackend;

    fn stores(&self) -> &MySqlBackend {
        &self.inner
    }

    fn watch(&self) -> &Watch {
        &self.inner.watch
    }

    async fn key_lookup(&self, key_type: KeyType) -> Option<Box<dyn KeyLookup>> {
        if !self.look_up {
            return None;
        }
        let prepared = TableLookup::prepare(self.pool(), &self.inner.watch, key_type).await;
        match prepared {
            Ok(lookup) => lookup.map(|lookup| Box::new(lookup) as Box<dyn KeyLookup>),
            Err(error) => {
                tracing::warn!(%error, "refusals wait for feed reads: the key column's facts could not be read");
                None
            }
        }
    }
}

impl Scans for MySqlLogBackend {
    type Source = LogScan;

    async fn key_source(&self) -> Result<KeySet<LogScan>, BackendError> {
        let set = self.inner.key_source().await?;
        let versions = self.trigger_versions().await?;
        Ok(KeySet {
            fingerprint: format!("{}:{versions}", set.fingerprint),
            source: LogScan::new(set.source, self.pool().clone()),
            trigger_versions: versions,
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        self.inner.key_columns().await
    }

    async fn has_unsafe_keys(&self, source: &LogScan) -> Result<bool, BackendError> {
        self.inner.has_unsafe_keys(&source.inner).await
    }
}

impl FeedReads for MySqlLogBackend {
    type Position = LogPosition;

    fn parse_position(text: &str) -> Option<LogPosition> {
        LogPosition::parse(text)
    }

    async fn position(&self) -> Result<Clock<LogPosition>, BackendError> {
        let mut connection = self.pool().acquire().await?;
        let at: i64 = sqlx::query_scalar("select cast(unix_timestamp(now(6)) * 1000000 as signed)")
            .fetch_one(&mut *connection)
            .await?;
        let position = feed::position_now(&mut connection).await?.ok_or_else(|| {
            BackendError::Feed(
                format!(
                    "{} is not on the binary log feed: call Watch::install_log",
                    self.inner.watch.feed_name()
                )
                .into(),
            )
        })?;
        Ok(Clock { position, at })
    }

    const UNWAITED_READS_ARE_CHEAPER: bool = true;

    async fn read_unwaited(&self, since: &LogPosition) -> Result<Read<LogPosition>, BackendError> {
        self.read_from(since, false).await
    }

    async fn read(&self, since: &LogPosition) -> Result<Read<LogPosition>, BackendError> {
        self.read_from(since, true).await
    }
}

impl FeedUpkeep for MySqlLogBackend {
    async fn pending(&self, since: &LogPosition, limit: u64) -> Result<u64, BackendError> {
        Ok(feed::pending(self.pool(), self.inner.watch.feed_name(), since, limit).await?)
    }

    async fn prune(&self, retention: Duration) -> Result<i64, BackendError> {
        Ok(feed::prune(self.pool(), retention).await?)
    }
}

impl Checks for MySqlLogBackend {
    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        let watch = &self.inner.watch;
        let mut gaps = Vec::new();
        if let Some(gap) = install::log_settings_gap(self.pool(), watch).await? {
            gaps.push(gap);
        }
        if !registry::is_logged(self.pool(), watch).await? {
            gaps.push(format!(
                "{} is not on the binary log feed: call Watch::install_log",
                watch.feed_name()
            ));
        }
        if !catalog::stored_triggers(self.pool(), watch)
            .await?
            .is_empty()
        {
            gaps.push(format!(
                "{} has the trigger feed's triggers too: a table has one feed",
                watch.table
            ));
        }
        Ok(gaps)
    }

    async fn repair(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        let installed: Option<i64> =
            sqlx::query_scalar("select installed_at from bloom_guard_log_tables where guard = ?")
                .bind(self.inner.watch.feed_name())
                .fetch_optional(self.pool())
                .await
                .or_else(|error| match error {
                    sqlx::Error::Database(ref database)
                        if database.code().as_deref() == Some("42S02") =>
                    {
                        Ok(None)
                    }
                    error => Err(error),
                })?;
        Ok(format!("binlog@{}", installed.unwrap_or_default()))
    }
}

impl Wakes for MySqlLogBackend {
    fn announces_changes(&self) -> bool {
        true
    }

    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let database = self.database();
        let feed = super::wake::watch(
            database.clone(),
            self.pool().clone(),
            std::sync::Arc::clone(&wake.feed),
            stop.clone(),
        );
        // Settings and snapshots announced as on the trigger feed.
        let others = self.inner.wake_ups(wake, stop);
        let (pool, url) = (self.pool().clone(), self.url.clone());
        async move {
            // The process's producer for this database, for as long as a
            // follower of it runs.
            let _producer = super::producer::join(database, pool, url);
            tokio::join!(feed, others);
        }
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}
