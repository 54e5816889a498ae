//! Keys from any sqlx query, for SQLite and the other databases.

use bloom_guard::{keys::KeyBatch, KeySource};
use futures_util::stream::{BoxStream, StreamExt};
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Type};

use crate::error::SourceError;
use crate::source::batches::{spawn_scan, BatchSender};

/// Every key of a query, fetched row by row through any sqlx pool.
///
/// Works wherever sqlx does (SQLite, Postgres, MySQL); on Postgres,
/// [`postgres::CopySource`](crate::postgres::CopySource) is faster. The count hint runs
/// `select count(*) from (query)`, or [`count_query`](Self::count_query).
///
/// # Example
///
/// ```no_run
/// use bloom_guard::BloomGuard;
/// use bloom_guard_sqlx::QuerySource;
///
/// # async fn run(pool: sqlx::SqlitePool) {
/// let guard = BloomGuard::builder().build();
/// guard.clone().warm(QuerySource::new(pool, "select key from items")).await;
/// # }
/// ```
#[derive(Debug)]
pub struct QuerySource<DB: Database> {
    pool: Pool<DB>,
    query: String,
    count_query: String,
}

impl<DB: Database> Clone for QuerySource<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            query: self.query.clone(),
            count_query: self.count_query.clone(),
        }
    }
}

impl<DB: Database> QuerySource<DB> {
    /// A source for `query`, which must select exactly one text column: the
    /// key, in the same form requests carry it.
    pub fn new(pool: Pool<DB>, query: impl Into<String>) -> Self {
        let query = query.into();
        Self {
            pool,
            count_query: format!("select count(*) from ({query}) as bloom_guard_keys"),
            query,
        }
    }

    /// A query returning the number of keys as one integer, instead of
    /// counting the rows of the key query.
    #[must_use]
    pub fn count_query(mut self, query: impl Into<String>) -> Self {
        self.count_query = query.into();
        self
    }
}

impl<DB> KeySource for QuerySource<DB>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> Option<String>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    type Error = SourceError;

    async fn count_hint(&self) -> Result<Option<u64>, SourceError> {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(self.count_query.as_str()))
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(count.max(0) as u64))
    }

    fn keys(&self) -> BoxStream<'static, Result<KeyBatch, SourceError>> {
        let pool = self.pool.clone();
        let query = self.query.clone();
        spawn_scan(move |batches| async move {
            let mut rows =
                sqlx::query_scalar::<DB, Option<String>>(AssertSqlSafe(query)).fetch(&pool);
            let mut batch = BatchSender::new_batch();
            while let Some(key) = rows.next().await {
                // A NULL key names no row a request can find.
                let Some(key) = key? else { continue };
                batch.push(key.as_bytes());
                if !batches.send_if_full(&mut batch).await {
                    return Ok(());
                }
            }
            batches.finish(batch).await;
            Ok(())
        })
    }
}
/// Whether any key of `query` meets `condition`, an SQL test of `k.key`
/// (the backends' checks for keys a case-insensitive guard cannot fold).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn any_key_where<DB>(
    pool: &Pool<DB>,
    query: &str,
    condition: &str,
) -> Result<bool, sqlx::Error>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    sqlx::query_scalar(AssertSqlSafe(format!(
        "select exists (select 1 from ({query}) k(key) where {condition})"
    )))
    .fetch_one(pool)
    .await
}
