//! Snapshots kept in SQL tables, the same way on every database: a row per
//! snapshot and its bytes in chunks, written in one transaction and read
//! back chunk by chunk into the filter's memory. Each backend brings its
//! own statements.

use std::future::Future;

use bloom_guard::snapshot::{
    Snapshot, SnapshotError, SnapshotReader, SnapshotWriter, SNAPSHOT_FORMAT,
};
use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

/// A stored snapshot, as listed.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) id: i64,
    pub(crate) len: i64,
    /// When the scan its filter descends from started (µs since the epoch,
    /// the database's clock).
    pub(crate) scanned_at: i64,
    /// Seconds since it was published.
    pub(crate) age_secs: f64,
}

/// Why a stored snapshot was not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// The database failed: try again later.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The snapshot is damaged or of another format: never use it.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

/// Where a backend keeps its snapshots.
pub(crate) trait SnapshotStore: Send + Sync + 'static {
    /// The newest snapshot of `guard` for `fingerprint`.
    fn newest(
        &self,
        guard: &str,
        fingerprint: &str,
    ) -> impl Future<Output = Result<Option<Stored>, sqlx::Error>> + Send;

    /// A stored snapshot, read chunk by chunk and checked.
    fn load(&self, stored: &Stored) -> impl Future<Output = Result<Snapshot, LoadError>> + Send;

    /// Stores `writer`'s snapshot, keeps the newest few, wakes the other
    /// instances; the new snapshot's id.
    fn publish(
        &self,
        writer: SnapshotWriter,
        scanned_at: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

/// Bytes per stored chunk: rows stay small, and a load or a publish holds
/// about one chunk besides the filter (1 MiB: 4 MiB added about 6 MiB to
/// a second start's peak memory at 10M keys).
const CHUNK_BYTES: usize = 1 << 20;

/// A backend's statements for its snapshot tables.
#[derive(Debug)]
pub(crate) struct Statements {
    /// The newest snapshot of guard `$1` in a format from 2 (the oldest
    /// any version reads) to `$2` (the newest this one reads) for
    /// fingerprint `$3`: id, length, scan time (µs), age in seconds (a
    /// float).
    pub(crate) newest: &'static str,
    /// Selects the chunks' bytes of snapshot `$1`, in order.
    pub(crate) chunks: &'static str,
    /// Inserts a snapshot (guard, format, fingerprint, position, scan time
    /// in µs, length, keys) and returns its id, or (with `inserted_id`)
    /// returns nothing.
    pub(crate) insert: &'static str,
    /// Selects the id `insert` gave, where `insert` cannot return it
    /// (MySQL).
    pub(crate) inserted_id: Option<&'static str>,
    /// Inserts chunk (snapshot, sequence number, bytes).
    pub(crate) insert_chunk: &'static str,
    /// Run last in the publishing transaction with the guard's name as the
    /// one parameter: dropping old snapshots, waking other instances.
    pub(crate) after: &'static [&'static str],
}

/// The snapshot tables of one database.
#[derive(Debug)]
pub(crate) struct Tables<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) statements: &'static Statements,
}

impl<DB: Database> Tables<DB> {
    pub(crate) fn new(pool: &Pool<DB>, statements: &'static Statements) -> Self {
        Self {
            pool: pool.clone(),
            statements,
        }
    }
}

impl<DB: Database> Clone for Tables<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            statements: self.statements,
        }
    }
}

impl<DB> SnapshotStore for Tables<DB>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> &'r [u8]: Decode<'r, DB> + Type<DB>,
    for<'r> (i64, i64, i64, f64): sqlx::FromRow<'r, DB::Row>,
    for<'r> i64: Decode<'r, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    async fn newest(&self, guard: &str, fingerprint: &str) -> Result<Option<Stored>, sqlx::Error> {
        let row: Option<(i64, i64, i64, f64)> =
            sqlx::query_as::<DB, _>(AssertSqlSafe(self.statements.newest))
                .bind(guard.to_owned())
                .bind(i32::try_from(SNAPSHOT_FORMAT).unwrap_or(i32::MAX))
                .bind(fingerprint.to_owned())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(id, len, scanned_at, age_secs)| Stored {
            id,
            len,
            scanned_at,
            age_secs,
        }))
    }

    async fn load(&self, stored: &Stored) -> Result<Snapshot, LoadError> {
        load(&self.pool, self.statements, stored).await
    }

    async fn publish(&self, writer: SnapshotWriter, scanned_at: i64) -> Result<i64, sqlx::Error> {
        publish(&self.pool, self.statements, writer, scanned_at).await
    }
}

/// Reads `stored`'s chunks in one statement (one consistent read), into the
/// filter's memory, and checks the whole.
async fn load<DB>(
    pool: &Pool<DB>,
    statements: &Statements,
    stored: &Stored,
) -> Result<Snapshot, LoadError>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> &'r [u8]: Decode<'r, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut reader = SnapshotReader::new(u64::try_from(stored.len).unwrap_or(0));
    let mut rows = sqlx::query::<DB>(AssertSqlSafe(statements.chunks))
        .bind(stored.id)
        .fetch(pool);
    while let Some(row) = rows.try_next().await? {
        // Read where the row holds it: a chunk is never copied whole.
        reader.push(row.try_get::<&[u8], _>(0)?)?;
    }
    Ok(reader.finish()?)
}

/// Stores `writer`'s snapshot in one transaction (a failure half-way leaves
/// the previous snapshots as they were); the new snapshot's id.
async fn publish<DB>(
    pool: &Pool<DB>,
    statements: &Statements,
    writer: SnapshotWriter,
    scanned_at: i64,
) -> Result<i64, sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    <DB as Database>::Arguments: IntoArguments<DB>,
    for<'r> i64: Decode<'r, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let info = writer.info().clone();
    let mut tx = pool.begin().await?;
    let insert = sqlx::query::<DB>(AssertSqlSafe(statements.insert))
        .bind(info.guard.clone())
        .bind(i32::try_from(writer.format()).unwrap_or(i32::MAX))
        .bind(info.fingerprint.clone())
        .bind(info.position.clone())
        .bind(scanned_at)
        .bind(i64::try_from(info.len).unwrap_or(i64::MAX))
        .bind(i64::try_from(info.keys).unwrap_or(i64::MAX));
    let id: i64 = match statements.inserted_id {
        Some(inserted_id) => {
            insert.execute(&mut *tx).await?;
            sqlx::query_scalar::<DB, i64>(AssertSqlSafe(inserted_id))
                .fetch_one(&mut *tx)
                .await?
        }
        None => {
            insert
                .try_map(|row: DB::Row| row.try_get(0))
                .fetch_one(&mut *tx)
                .await?
        }
    };
    for (seq, chunk) in writer.chunks(CHUNK_BYTES).enumerate() {
        sqlx::query::<DB>(AssertSqlSafe(statements.insert_chunk))
            .bind(id)
            .bind(i32::try_from(seq).unwrap_or(i32::MAX))
            .bind(chunk)
            .execute(&mut *tx)
            .await?;
    }
    for statement in statements.after {
        sqlx::query::<DB>(AssertSqlSafe(*statement))
            .bind(info.guard.clone())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(id)
}
