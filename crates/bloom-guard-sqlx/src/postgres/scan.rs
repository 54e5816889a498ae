//! Postgres keys through `COPY (query) TO STDOUT`.

use bloom_guard::{keys::KeyBatch, KeySource};
use futures_util::stream::{BoxStream, StreamExt};
use sqlx::{AssertSqlSafe, PgPool};

use crate::error::SourceError;
use crate::source::batches::{spawn_scan, BatchSender};
use crate::source::copy_text::CopyTextDecoder;

/// Every key of a Postgres query, streamed with `COPY (query) TO STDOUT`.
///
/// `COPY` hands rows out as fast as Postgres can read them, several times
/// faster than fetching rows one by one. The text output is decoded on a
/// task of its own while the guard inserts the previous batch, and memory
/// stays bounded by a few batches whatever the table's size.
///
/// The count hint is the planner's row estimate for the query (`EXPLAIN`,
/// no scan), or the result of [`count_query`](Self::count_query) if set.
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::postgres;
///
/// # async fn run(pool: sqlx::PgPool) {
/// let guard = BloomGuard::builder().expected_items(1_000_000).build();
/// tokio::spawn(guard.clone().warm(postgres::CopySource::new(pool, "select key from items")));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CopySource {
    pool: PgPool,
    query: String,
    count_query: Option<String>,
    /// Scan in a REPEATABLE READ transaction and tag the first batch with
    /// its snapshot, as the change feed's position (the follower's scans).
    feed_position: bool,
    /// Scan at a point of the write-ahead log, reached at this URL, and
    /// tag the first batch with it (the log feed's scans).
    #[cfg(feature = "log-feed")]
    log_point: Option<String>,
}

impl CopySource {
    /// The key query.
    pub(crate) fn query(&self) -> &str {
        &self.query
    }

    /// A source for `query`, which must select exactly one text column:
    /// the key, in the same form requests carry it.
    pub fn new(pool: PgPool, query: impl Into<String>) -> Self {
        Self {
            pool,
            query: query.into(),
            count_query: None,
            feed_position: false,
            #[cfg(feature = "log-feed")]
            log_point: None,
        }
    }

    /// Scans at a point of the write-ahead log: a snapshot that a temporary
    /// slot exports with its consistent point, through a replication
    /// connection to `url`; the point, as text, tags the first batch: the
    /// log feed's position of exactly the rows scanned.
    #[cfg(feature = "log-feed")]
    pub(crate) fn at_log_point(mut self, url: String) -> Self {
        self.log_point = Some(url);
        self
    }

    /// Scans in a REPEATABLE READ transaction whose snapshot, as text,
    /// tags the first batch: the change feed's position of exactly the
    /// rows scanned.
    pub(crate) fn with_feed_position(mut self) -> Self {
        self.feed_position = true;
        self
    }

    /// A query returning the number of keys as one `bigint`, run instead of
    /// the planner's estimate: `select count(*) from items` is exact but
    /// scans the table once more.
    #[must_use]
    pub fn count_query(mut self, query: impl Into<String>) -> Self {
        self.count_query = Some(query.into());
        self
    }
}

impl KeySource for CopySource {
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        if let Some(count_query) = &self.count_query {
            let count: i64 = sqlx::query_scalar(AssertSqlSafe(count_query.as_str()))
                .fetch_one(&self.pool)
                .await?;
            return Ok(Some(count.max(0) as u64));
        }
        let plan: Vec<String> =
            sqlx::query_scalar(AssertSqlSafe(format!("explain {}", self.query)))
                .fetch_all(&self.pool)
                .await?;
        Ok(plan.first().and_then(|line| planned_rows(line)))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let pool = self.pool.clone();
        let statement = format!("copy ({}) to stdout", self.query);
        let feed_position = self.feed_position;
        #[cfg(feature = "log-feed")]
        let log_point = self.log_point.clone();
        spawn_scan(move |batches| async move {
            let mut conn = pool.acquire().await?;
            let mut batch = BatchSender::new_batch();
            // Held until the COPY's transaction has taken its snapshot.
            #[cfg(feature = "log-feed")]
            let point = match log_point {
                Some(url) => {
                    let server = super::log::url::Server::of(&mut *conn).await?;
                    let url = super::servers::narrowed(&url, &pool);
                    let point = super::log::stream::ScanPoint::take(&url, server.as_ref()).await;
                    Some(point.map_err(|error| {
                        SourceError::LogPoint(crate::error::error_chain(&error))
                    })?)
                }
                None => None,
            };
            #[cfg(feature = "log-feed")]
            if let Some(point) = &point {
                conn.close_on_drop();
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "begin isolation level repeatable read, read only; set transaction snapshot '{}'",
                    point.snapshot.replace('\'', "''")
                )))
                .execute(&mut *conn)
                .await?;
                // The epoch as the scan's snapshot sees it: the position is
                // that epoch's.
                let epoch = super::log::slot::epoch(&mut *conn).await?;
                batch.set_position(format!("{}/{epoch}", point.lsn));
            }
            #[cfg(feature = "log-feed")]
            let feed_position = feed_position || point.is_some();
            #[cfg(feature = "log-feed")]
            drop(point);
            if feed_position && batch.position().is_none() {
                // The COPY reads the transaction's snapshot, taken by the
                // first statement: the position of exactly its rows. The
                // connection is closed after the scan, never handed back
                // with the transaction open whatever fails.
                conn.close_on_drop();
                sqlx::query("begin isolation level repeatable read, read only")
                    .execute(&mut *conn)
                    .await?;
                let snapshot: String = sqlx::query_scalar(AssertSqlSafe(format!(
                    "select {}",
                    super::position::POSITION_NOW
                )))
                .fetch_one(&mut *conn)
                .await?;
                batch.set_position(snapshot);
            }
            // A SQL_ASCII database stores any bytes, and Postgres refuses
            // to send the invalid ones to a UTF-8 client: take the bytes as
            // they are, and leave out those no request can name.
            let raw: bool =
                sqlx::query_scalar("select current_setting('server_encoding') = 'SQL_ASCII'")
                    .fetch_one(&mut *conn)
                    .await?;
            if raw {
                sqlx::query("set client_encoding = 'SQL_ASCII'")
                    .execute(&mut *conn)
                    .await?;
            }
            let mut chunks = conn.copy_out_raw(&statement).await?;
            let mut decoder = CopyTextDecoder::default();
            let mut complete = true;
            while let Some(chunk) = chunks.next().await {
                decoder.decode(&chunk?, &mut batch)?;
                if !batches.send_if_full(&mut batch).await {
                    complete = false;
                    break;
                }
            }
            drop(chunks);
            if !complete {
                // The rest of the COPY is still on the wire: do not hand
                // this connection back to the pool.
                conn.close_on_drop();
                return Ok(());
            }
            decoder.finish()?;
            if feed_position {
                sqlx::query("commit").execute(&mut *conn).await?;
            }
            if raw {
                sqlx::query("reset client_encoding")
                    .execute(&mut *conn)
                    .await?;
            }
            batches.finish(batch).await;
            Ok(())
        })
    }
}

/// The `rows=` estimate of the top line of a text `EXPLAIN`.
fn planned_rows(line: &str) -> Option<u64> {
    let rows = &line[line.find(" rows=")? + 6..];
    let end = rows
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rows.len());
    rows[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_planner_estimate() {
        let line = "Seq Scan on items  (cost=0.00..3084.00 rows=200000 width=10)";
        assert_eq!(planned_rows(line), Some(200_000));
        assert_eq!(
            planned_rows("Result  (cost=0.00..0.01 rows=1 width=32)"),
            Some(1)
        );
        assert_eq!(planned_rows("nonsense"), None);
    }
}
