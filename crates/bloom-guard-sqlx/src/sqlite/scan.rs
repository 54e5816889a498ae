//! Every key of a watched SQLite table, for a scan.

use bloom_guard::{keys::KeyBatch, KeySource};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, Row, Sqlite, SqlitePool, ValueRef};

use super::feed::{key_bytes, position_in};
use crate::error::SourceError;
use crate::source::batches::{spawn_scan, BatchSender};
use crate::source::query::QuerySource;

/// Every key of a watched SQLite table, BLOB keys counted as skipped.
#[derive(Debug, Clone)]
pub(crate) struct SqliteScan {
    pool: SqlitePool,
    query: String,
    /// Counts the rows of the key query.
    count: QuerySource<Sqlite>,
}

impl SqliteScan {
    /// The key query.
    pub(super) fn query(&self) -> &str {
        &self.query
    }

    pub(super) fn new(pool: SqlitePool, query: String) -> Self {
        Self {
            count: QuerySource::new(pool.clone(), query.clone()),
            pool,
            query,
        }
    }
}

impl KeySource for SqliteScan {
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        self.count.count_hint().await
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let (pool, query) = (self.pool.clone(), self.query.clone());
        spawn_scan(move |batches| async move {
            // One read transaction: the feed's last row and the keys from
            // one snapshot, so the first batch names the position of
            // exactly the rows scanned.
            let mut tx = pool.begin().await?;
            let position = position_in(&mut tx).await?;
            let mut batch = BatchSender::new_batch();
            batch.set_position(position.to_string());
            let mut rows = sqlx::query(AssertSqlSafe(query)).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                {
                    let value = row.try_get_raw(0)?;
                    // A NULL key names no row; a BLOB is a key no request names.
                    let null = value.is_null();
                    match key_bytes(value)? {
                        Some(key) => batch.push_text(key),
                        None if null => {}
                        None => batch.skip(),
                    }
                }
                if !batches.send_if_full(&mut batch).await {
                    return Ok(());
                }
            }
            drop(rows);
            tx.commit().await?;
            batches.finish(batch).await;
            Ok(())
        })
    }
}
