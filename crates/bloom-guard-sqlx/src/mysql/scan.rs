//! Every key of a watched MySQL table, for a scan.

use std::sync::Arc;

use bloom_guard::{keys::KeyBatch, KeySource};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, Row};

use super::feed::position_in;
use super::settle::Settled;
use crate::error::SourceError;
use crate::source::batches::{spawn_scan, BatchSender};
use crate::source::query::QuerySource;

/// Every key of a watched MySQL table, streamed from one snapshot that
/// also names the feed position of exactly the rows scanned.
#[derive(Debug, Clone)]
pub(crate) struct MySqlScan {
    pool: MySqlPool,
    query: String,
    settled: Arc<Settled>,
    /// Counts the rows of the key query.
    count: QuerySource<MySql>,
    /// The query reads keys as the server weighs them under a collation
    /// ([`Collation::weighed`](bloom_guard::keys::Collation::weighed)): bytes, not
    /// text.
    weighed: bool,
}

impl MySqlScan {
    pub(super) fn new(
        pool: MySqlPool,
        query: String,
        settled: Arc<Settled>,
        weighed: bool,
    ) -> Self {
        Self {
            weighed,
            count: QuerySource::new(pool.clone(), query.clone()),
            pool,
            query,
            settled,
        }
    }

    /// The key query.
    pub(super) fn query(&self) -> &str {
        &self.query
    }

    /// Whether the key query reads keys as the server weighs them.
    #[cfg(feature = "binlog-feed")]
    pub(super) fn weighed(&self) -> bool {
        self.weighed
    }
}

impl KeySource for MySqlScan {
    type Error = SourceError;

    /// The optimizer's estimate of the key query's rows (`EXPLAIN`, from
    /// InnoDB's statistics): sizing needs no exact count, and counting
    /// would read the whole table once more. A count where the estimate
    /// cannot be had.
    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        let plan = sqlx::query(AssertSqlSafe(format!("explain {}", self.query)))
            .fetch_all(&self.pool)
            .await;
        let estimate = plan.ok().and_then(|rows| {
            let row = rows.first()?;
            row.try_get::<Option<u64>, _>("rows")
                .ok()
                .flatten()
                .or_else(|| {
                    row.try_get::<Option<i64>, _>("rows")
                        .ok()
                        .flatten()?
                        .try_into()
                        .ok()
                })
        });
        match estimate {
            Some(rows) => Ok(Some(rows)),
            None => self.count.count_hint().await,
        }
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let (pool, query, settled, weighed) = (
            self.pool.clone(),
            self.query.clone(),
            Arc::clone(&self.settled),
            self.weighed,
        );
        spawn_scan(move |batches| async move {
            // Settled before the snapshot; the feed's position and the keys
            // from that one snapshot, so the first batch names the position
            // of exactly the rows scanned.
            let snapshot = settled.snapshot_statement(&pool).await?;
            let settled = settled.advance(&pool);
            let mut tx = pool.begin_with(snapshot).await?;
            let position = position_in(&mut tx, settled).await?;
            let Some(batch) =
                send_keys(&mut tx, &query, weighed, position.to_string(), &batches).await?
            else {
                return Ok(());
            };
            tx.commit().await?;
            batches.finish(batch).await;
            Ok(())
        })
    }
}

/// Sends the keys `query` reads on `connection` to `batches`, the first
/// batch naming `position`; the last batch, unsent, or `None` if the
/// receiver is gone.
pub(super) async fn send_keys(
    connection: &mut sqlx::MySqlConnection,
    query: &str,
    weighed: bool,
    position: String,
    batches: &BatchSender,
) -> Result<Option<KeyBatch>, SourceError> {
    let mut batch = BatchSender::new_batch();
    batch.set_position(position);
    let mut rows = sqlx::query(AssertSqlSafe(query)).fetch(connection);
    while let Some(row) = rows.try_next().await? {
        // A NULL key names no row.
        if let Some(key) = row.try_get::<Option<&[u8]>, _>(0)? {
            if weighed {
                batch.push(key);
            } else {
                batch.push_text(key);
            }
        }
        if !batches.send_if_full(&mut batch).await {
            return Ok(None);
        }
    }
    Ok(Some(batch))
}
