//! Feed reads on a replica (a hot standby of the primary): the replica
//! answers them, and a read counts only once the replica has replayed past
//! the primary's log position taken after the read was asked for, so it
//! holds every change committed before; a replica that lags past a bound
//! leaves the read to the primary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use tokio::time::{sleep, Instant};

use super::feed::{self, FeedRead};
use super::position::PgPosition;
use crate::follow::Read;
use crate::kept::KeptConnection;

/// How long a read waits for the replica to replay past the primary's
/// position before it reads on the primary (default of
/// [`postgres::Follower::replica_lag`](super::Follower::replica_lag)).
pub(super) const MAX_LAG: Duration = Duration::from_millis(100);

/// The longest pause between two looks at a replica replaying.
const LONGEST_PAUSE: Duration = Duration::from_millis(10);

/// A replica the feed reads go to.
#[derive(Debug, Clone)]
pub(super) struct Replica {
    pub(super) pool: PgPool,
    feed: Arc<KeptConnection<PgConnection>>,
    pub(super) max_lag: Duration,
    /// Whether the last read went to the primary (logged once per spell).
    lagging: Arc<AtomicBool>,
}

impl Replica {
    pub(super) fn new(pool: PgPool) -> Self {
        Self {
            feed: Arc::new(feed::feed_connection(&pool)),
            pool,
            max_lag: MAX_LAG,
            lagging: Arc::default(),
        }
    }

    /// Reads `feeds` on the replica once it has replayed past the primary's
    /// position now (taken on `primary`, one statement), or on `primary`
    /// if it has not within the bound.
    pub(super) async fn read(
        &self,
        primary: &KeptConnection<PgConnection>,
        feeds: &[FeedRead<'_>],
    ) -> Result<Vec<Read<PgPosition>>, sqlx::Error> {
        let mark = primary_mark(primary).await?;
        let deadline = Instant::now() + self.max_lag;
        let mut pause = Duration::from_millis(1);
        loop {
            match read_replica(&self.feed, feeds, &mark).await {
                Ok(Some(read)) => {
                    if self.lagging.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            "the replica has caught up; the change feed is read there again"
                        );
                    }
                    return Ok(read);
                }
                Ok(None) if Instant::now() + pause < deadline => {
                    sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
                outcome => {
                    if !self.lagging.swap(true, Ordering::Relaxed) {
                        match outcome {
                            Err(error) => {
                                tracing::warn!(%error, "cannot read the change feed on the replica; reading it on the primary");
                            }
                            _ => {
                                tracing::warn!(bound = ?self.max_lag, "the replica lags behind the primary past the bound; reading the change feed on the primary");
                            }
                        }
                    }
                    return feed::read_kept(primary, feeds).await;
                }
            }
        }
    }

    /// Closes the replica's kept connection.
    pub(super) async fn close(&self) {
        self.feed.close().await;
    }
}

/// The primary's [`PrimaryMark`](feed::PrimaryMark) now, on its kept connection.
pub(super) async fn primary_mark(
    kept: &KeptConnection<PgConnection>,
) -> Result<feed::PrimaryMark, sqlx::Error> {
    static MARK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "select {}, pg_catalog.pg_current_wal_insert_lsn()::text",
            super::position::TIMELINE_NOW
        )
    });
    crate::kept::again_if_lost(|| async {
        let mut lease = kept.lease().await?;
        let (timeline, lsn) = crate::kept::within_timeout(
            sqlx::query_as(AssertSqlSafe(MARK.as_str())).fetch_one(lease.connection()),
        )
        .await?;
        lease.keep();
        Ok(feed::PrimaryMark { timeline, lsn })
    })
    .await
}

/// Reads the changes of `feeds` on a replica's kept connection, once it has
/// replayed past `mark`; `None` if it has not yet.
pub(super) async fn read_replica(
    kept: &KeptConnection<PgConnection>,
    feeds: &[FeedRead<'_>],
    mark: &feed::PrimaryMark,
) -> Result<Option<Vec<Read<PgPosition>>>, sqlx::Error> {
    crate::kept::again_if_lost(|| async {
        let mut lease = kept.lease().await?;
        let read = crate::kept::within_timeout(feed::read_marked(
            lease.connection(),
            (feed::READ_ON_REPLICA.as_str(), true),
            feeds,
            Some(mark),
        ))
        .await?;
        lease.keep();
        Ok(read)
    })
    .await
}
