//! The follower engine's backend for a table on the log feed: positions
//! are commit ends, scans are taken at a slot's exported snapshot, reads
//! wait for the producer (the barrier by log position), and the check
//! looks at the table's place on the log feed instead of triggers. The
//! rest (snapshots, the fleet, locks, the key query) is the Postgres
//! backend's.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::install::slot_name;
use super::position::LogPosition;
use crate::follow::changes::Changes;
use crate::follow::column::KeyColumn;
use crate::follow::{
    BackendError, Checks, Clock, Database, FeedReads, FeedUpkeep, KeySet, Read, Scans, WakeUps,
    Wakes,
};
use crate::per_database::database_key;
use crate::postgres::{store::snapshot, wake, CopySource, PgBackend};
use crate::watch::Watch;

/// How long a read waits for the producer to reach the log's position
/// before it fails (and the guard lets requests through meanwhile).
const PRODUCER_BOUND: Duration = Duration::from_secs(5);

/// How long the slot may stay behind the log with no reader moving it
/// before the guards fail open (default of
/// [`postgres::log::Follower::stalled_after`](super::Follower::stalled_after)).
pub(super) const STALLED_AFTER: Duration = Duration::from_secs(30);

/// A Postgres table on the log feed.
#[derive(Debug, Clone)]
pub(crate) struct PgLogBackend {
    pub(super) inner: PgBackend,
    /// The database's URL, for replication connections.
    pub(super) url: String,
    /// The database's slot, once known.
    slot: std::sync::Arc<tokio::sync::OnceCell<String>>,
    /// Since when the checks have seen the slot behind the log and not
    /// moving, and its confirmed position then.
    stalled: std::sync::Arc<std::sync::Mutex<Option<(std::time::Instant, u64)>>>,
    pub(super) stalled_after: Duration,
}

impl PgLogBackend {
    pub(crate) fn new(inner: PgBackend, url: String) -> Self {
        Self {
            inner,
            url,
            slot: std::sync::Arc::default(),
            stalled: std::sync::Arc::default(),
            stalled_after: STALLED_AFTER,
        }
    }

    /// The check's look, in one round trip, and its gaps (the slot's stall
    /// among them).
    async fn check(&self) -> Result<crate::follow::Catalog, sqlx::Error> {
        let slot = self.slot().await?.to_owned();
        let look = super::check::look(self.pool(), &self.inner.watch, &slot).await?;
        let mut gaps = look.gaps(&self.inner.watch, &slot);
        gaps.extend(self.stall(&slot, &look));
        Ok(crate::follow::Catalog {
            gaps,
            versions: Some(look.versions),
            counts_rows: Some(true),
        })
    }

    /// A gap if the slot has stayed behind the log, its confirmed position
    /// not moving, for longer than `stalled_after`: no instance streams it
    /// (every producer failing, a dead connection holding it), and every
    /// refusal would wait the barrier's bound before failing open.
    fn stall(&self, slot: &str, look: &super::check::Look) -> Option<String> {
        // A missing slot is a gap of its own; one being made has no
        // confirmed position yet.
        let (Some(confirmed), Some(behind), Some(active)) =
            (look.confirmed, look.behind, look.active)
        else {
            return None;
        };
        let confirmed = confirmed.unsigned_abs();
        let now = std::time::Instant::now();
        let mut stalled = self
            .stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let since = match *stalled {
            Some((since, at)) if behind && at == confirmed => since,
            _ if behind => {
                *stalled = Some((now, confirmed));
                now
            }
            _ => {
                *stalled = None;
                return None;
            }
        };
        let idle = now.duration_since(since);
        (idle > self.stalled_after).then(|| {
            format!(
                "the log feed's slot {slot} has stayed behind the log for {}s ({}): no instance's producer writes the feed (see its warnings)",
                idle.as_secs(),
                if active { "streamed, not moving" } else { "no instance streams it" }
            )
        })
    }

    fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    async fn slot(&self) -> Result<&str, sqlx::Error> {
        self.slot
            .get_or_try_init(|| slot_name(self.pool()))
            .await
            .map(String::as_str)
    }

    /// The guard's rows after `since`, waiting for the producer when
    /// `barrier`.
    async fn read_log(
        &self,
        since: &LogPosition,
        barrier: bool,
    ) -> Result<Read<LogPosition>, BackendError> {
        let mut reads = Self::read_logs(&[(self, since)], barrier).await?;
        Ok(reads.pop().ok_or(sqlx::Error::RowNotFound)?)
    }

    /// Each guard's rows after its position, in one statement on the
    /// first's connection, waiting for the producer once when `barrier`.
    async fn read_logs(
        reads: &[(&Self, &LogPosition)],
        barrier: bool,
    ) -> Result<Vec<Read<LogPosition>>, BackendError> {
        let Some((first, _)) = reads.first() else {
            return Ok(Vec::new());
        };
        let slot = first.slot().await?.to_owned();
        let feeds: Vec<_> = reads
            .iter()
            .map(|(backend, since)| super::feed::FeedAt {
                guard: backend.inner.watch.feed_name(),
                after: since.lsn,
                lowered: backend.inner.lowered,
            })
            .collect();
        let read = crate::kept::again_if_lost(|| async {
            let mut lease = first.inner.feed.lease().await?;
            let read = crate::kept::within_timeout(async {
                super::feed::read_feeds(
                    lease.connection(),
                    &slot,
                    &feeds,
                    barrier.then_some(PRODUCER_BOUND),
                )
                .await
                // A database error goes to the retries; the feed's own
                // (the producer behind, no slot, unseen members) passes.
                .map_or_else(
                    |error| match error {
                        super::feed::LogReadError::Database(error) => Err(error),
                        other => Ok(Err(other)),
                    },
                    |read| Ok(Ok(read)),
                )
            })
            .await?;
            lease.keep();
            Ok(read)
        })
        .await?
        .map_err(|error| BackendError::Feed(Box::new(error)))?;
        Ok(reads
            .iter()
            .zip(read)
            .map(|((_, since), read)| changes(since, &read))
            .collect())
    }
}

/// A read's rows as changes, or a rebuild where the read cannot hold the
/// changes after `since`: rows after it were pruned (the horizon as the
/// read's own snapshot saw it), or it belongs to another epoch of the feed
/// (a slot made since, whose start may lie below it). The epoch travels
/// with the position, so a read made for another guard cannot take this
/// one's rebuild from it.
fn changes(since: &LogPosition, read: &super::feed::LogRead) -> Read<LogPosition> {
    if since.epoch != read.epoch || since.lsn < read.horizon {
        return Read::Pruned;
    }
    let mut changes = Changes {
        lag: read.lag,
        ..Changes::default()
    };
    for row in &read.rows {
        let kind = [row.kind];
        let kind = std::str::from_utf8(&kind).unwrap_or("r");
        changes.record(kind, Some(row.key.as_bytes()));
    }
    Read::Changes {
        position: LogPosition {
            lsn: read.position,
            epoch: read.epoch.clone(),
        },
        changes,
    }
}

impl Database for PgLogBackend {
    /// The trigger feed's tables and build lock: a fleet shares them
    /// whichever feed fills its filters.
    type Stores = PgBackend;

    fn stores(&self) -> &PgBackend {
        &self.inner
    }

    fn watch(&self) -> &Watch {
        &self.inner.watch
    }
}

impl Scans for PgLogBackend {
    type Source = CopySource;

    async fn key_source(&self) -> Result<KeySet<CopySource>, BackendError> {
        let watch = &self.inner.watch;
        let query = watch.key_query(self.pool(), self.inner.lowered).await?;
        let versions = self.trigger_versions().await?;
        let fingerprint = snapshot::fingerprint(self.pool(), &query, &versions).await?;
        Ok(KeySet {
            source: CopySource::new(self.pool().clone(), query).at_log_point(self.url.clone()),
            fingerprint,
            trigger_versions: versions,
        })
    }

    async fn key_columns(&self) -> Result<Vec<KeyColumn>, BackendError> {
        self.inner.key_columns().await
    }

    async fn has_unsafe_keys(&self, source: &CopySource) -> Result<bool, BackendError> {
        self.inner.has_unsafe_keys(source).await
    }
}

impl FeedReads for PgLogBackend {
    type Position = LogPosition;

    fn parse_position(text: &str) -> Option<LogPosition> {
        LogPosition::parse(text)
    }

    async fn position(&self) -> Result<Clock<LogPosition>, BackendError> {
        let slot = self.slot().await?.to_owned();
        let at = self.inner.position().await?.at;
        let (lsn, epoch) = super::feed::written(self.pool(), &slot).await?;
        Ok(Clock {
            position: LogPosition { lsn, epoch },
            at,
        })
    }

    async fn read(&self, since: &LogPosition) -> Result<Read<LogPosition>, BackendError> {
        self.read_log(since, true).await
    }

    async fn read_behind(&self, since: &LogPosition) -> Result<Read<LogPosition>, BackendError> {
        self.read_log(since, false).await
    }

    const UNWAITED_READS_ARE_CHEAPER: bool = true;

    fn shared_reads(&self) -> Option<String> {
        self.inner.shared_reads()
    }

    /// Always for refusals: the producer waited for once for all.
    async fn read_together(
        reads: &[(&Self, &LogPosition)],
    ) -> Result<Vec<Read<LogPosition>>, BackendError> {
        Self::read_logs(reads, true).await
    }

    async fn read_unwaited(&self, since: &LogPosition) -> Result<Read<LogPosition>, BackendError> {
        self.read_log(since, false).await
    }
}

impl FeedUpkeep for PgLogBackend {
    async fn pending(&self, since: &LogPosition, limit: u64) -> Result<u64, BackendError> {
        Ok(
            super::feed::pending(self.pool(), self.inner.watch.feed_name(), since.lsn, limit)
                .await?,
        )
    }

    async fn prune(&self, retention: Duration) -> Result<i64, BackendError> {
        Ok(super::feed::prune(self.pool(), retention).await?)
    }
}

impl Checks for PgLogBackend {
    /// The pool's sessions, and that the replication URL reaches its
    /// database.
    async fn check_session(&self) -> Result<(), crate::error::FeedError> {
        let (session, replication) = tokio::join!(
            self.inner.check_session(),
            super::url::check_replication(self.pool(), &self.url)
        );
        session.and(replication)
    }

    async fn gaps(&self) -> Result<Vec<String>, BackendError> {
        Ok(self.check().await?.gaps)
    }

    async fn catalog(&self) -> Result<crate::follow::Catalog, BackendError> {
        Ok(self.check().await?)
    }

    async fn repair(&self) -> Result<bool, BackendError> {
        Ok(false)
    }

    async fn trigger_versions(&self) -> Result<String, BackendError> {
        Ok(super::check::versions(self.pool(), &self.inner.watch).await?)
    }
}

impl Wakes for PgLogBackend {
    fn announces_changes(&self) -> bool {
        true
    }

    fn wake_ups(
        &self,
        wake: WakeUps,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let options = self.pool().connect_options();
        let database = database_key(
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default(),
            options.get_username(),
        );
        let listen = wake::listen(self.pool().clone(), wake, stop.clone());
        let (pool, url) = (self.pool().clone(), self.url.clone());
        async move {
            // The process's producer for this database, for as long as a
            // follower of it runs.
            let _producer = super::producer::join(database, pool, url);
            listen.await;
        }
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

#[cfg(test)]
mod tests;
