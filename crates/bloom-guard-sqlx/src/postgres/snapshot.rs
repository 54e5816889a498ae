//! Filter snapshots in `bloom_guard.snapshots`: publishing, finding the
//! newest, loading one chunk by chunk, and the lock that makes one
//! instance of a fleet build at a time.

use bloom_guard::{Snapshot, SnapshotReader, SnapshotWriter, SNAPSHOT_FORMAT};
use futures_util::TryStreamExt;
use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};

use crate::follow::{Clock, LoadError, Stored};

/// Bytes per stored chunk: rows stay small, and a load holds one chunk
/// besides the filter.
const CHUNK_BYTES: usize = 4 << 20;

/// Snapshots kept per guard: the newest, and the one before it.
const KEPT: i64 = 2;

/// What names a guard's key set: the database (cluster and database, as a
/// feed position means nothing elsewhere) and the key query.
pub(super) async fn fingerprint(pool: &PgPool, key_query: &str) -> Result<String, sqlx::Error> {
    let database: String = sqlx::query_scalar(
        "select (select system_identifier from pg_catalog.pg_control_system())::text
                || '/' || (select oid from pg_catalog.pg_database where datname = pg_catalog.current_database())::text",
    )
    .fetch_one(pool)
    .await?;
    let digest = Sha256::new()
        .chain_update(database.as_bytes())
        .chain_update([0])
        .chain_update(key_query.as_bytes())
        .finalize();
    Ok(digest.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The newest snapshot of `guard` for `fingerprint` in this format.
pub(super) async fn newest(
    pool: &PgPool,
    guard: &str,
    fingerprint: &str,
) -> Result<Option<Stored>, sqlx::Error> {
    let row: Option<(i64, i64, i64, f64)> = sqlx::query_as(
        "select id, len,
                (extract(epoch from scanned_at) * 1000000)::int8,
                extract(epoch from pg_catalog.now() - created_at)::float8
           from bloom_guard.snapshots
          where guard = $1 and format = $2 and fingerprint = $3
          order by id desc limit 1",
    )
    .bind(guard)
    .bind(SNAPSHOT_FORMAT as i32)
    .bind(fingerprint)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(id, len, scanned_at, age_secs)| Stored {
        id,
        len,
        scanned_at,
        age_secs,
    }))
}

/// Reads a stored snapshot's chunks, in order, straight into the filter's
/// memory, and checks it.
pub(super) async fn load(pool: &PgPool, stored: &Stored) -> Result<Snapshot, LoadError> {
    let mut reader = SnapshotReader::new(u64::try_from(stored.len).unwrap_or(0));
    let mut chunks = sqlx::query_scalar::<_, Vec<u8>>(
        "select data from bloom_guard.snapshot_chunks where snapshot = $1 order by seq",
    )
    .bind(stored.id)
    .fetch(pool);
    while let Some(chunk) = chunks.try_next().await? {
        reader.push(&chunk)?;
    }
    Ok(reader.finish()?)
}

/// Stores `writer`'s snapshot in one transaction (a failure half-way leaves
/// the previous snapshots as they were), drops all but the newest two, and
/// wakes the other instances. Returns the new snapshot's id.
pub(super) async fn publish(
    pool: &PgPool,
    writer: SnapshotWriter,
    scanned_at: i64,
) -> Result<i64, sqlx::Error> {
    let info = writer.info().clone();
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar(
        "insert into bloom_guard.snapshots (guard, format, fingerprint, position, scanned_at, len, keys)
         values ($1, $2, $3, $4, pg_catalog.to_timestamp($5::float8 / 1000000), $6, $7)
         returning id",
    )
    .bind(&info.guard)
    .bind(SNAPSHOT_FORMAT as i32)
    .bind(&info.fingerprint)
    .bind(&info.position)
    .bind(scanned_at)
    .bind(i64::try_from(info.len).unwrap_or(i64::MAX))
    .bind(i64::try_from(info.keys).unwrap_or(i64::MAX))
    .fetch_one(&mut *tx)
    .await?;
    for (seq, chunk) in writer.chunks(CHUNK_BYTES).enumerate() {
        sqlx::query(
            "insert into bloom_guard.snapshot_chunks (snapshot, seq, data) values ($1, $2, $3)",
        )
        .bind(id)
        .bind(seq as i32)
        .bind(chunk)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "delete from bloom_guard.snapshots
          where guard = $1 and id not in (
                select id from bloom_guard.snapshots where guard = $1 order by id desc limit $2)",
    )
    .bind(&info.guard)
    .bind(KEPT)
    .execute(&mut *tx)
    .await?;
    sqlx::query("select pg_catalog.pg_notify('bloom_guard', $1)")
        .bind(&info.guard)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(id)
}

/// The feed's position and the database's clock (µs since the epoch), in
/// one statement.
pub(super) async fn position_now(pool: &PgPool) -> Result<Clock<String>, sqlx::Error> {
    let (position, at) = sqlx::query_as(
        "select pg_catalog.pg_current_snapshot()::text,
                (extract(epoch from pg_catalog.clock_timestamp()) * 1000000)::int8",
    )
    .fetch_one(pool)
    .await?;
    Ok(Clock { position, at })
}

/// The fleet-wide lock on building `guard`'s filter: a session advisory
/// lock on a connection of its own, released when the connection closes,
/// so a crashed holder never keeps it. Dropped, it closes its connection.
pub(crate) struct PgBuildLock {
    connection: Option<PgConnection>,
}

impl std::fmt::Debug for PgBuildLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBuildLock").finish_non_exhaustive()
    }
}

const LOCK_SQL: &str = "select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.build'), pg_catalog.hashtext($1))";
const TRY_LOCK_SQL: &str = "select pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('bloom_guard.build'), pg_catalog.hashtext($1))";

impl PgBuildLock {
    /// Waits for the lock.
    pub(super) async fn acquire(pool: &PgPool, guard: &str) -> Result<Self, sqlx::Error> {
        let mut connection = PgConnection::connect_with(&pool.connect_options()).await?;
        sqlx::query(LOCK_SQL)
            .bind(guard)
            .execute(&mut connection)
            .await?;
        Ok(Self {
            connection: Some(connection),
        })
    }

    /// The lock if nobody holds it.
    pub(super) async fn try_acquire(
        pool: &PgPool,
        guard: &str,
    ) -> Result<Option<Self>, sqlx::Error> {
        let mut connection = PgConnection::connect_with(&pool.connect_options()).await?;
        let locked: bool = sqlx::query_scalar(TRY_LOCK_SQL)
            .bind(guard)
            .fetch_one(&mut connection)
            .await?;
        if !locked {
            connection.close().await?;
            return Ok(None);
        }
        Ok(Some(Self {
            connection: Some(connection),
        }))
    }
}

impl Drop for PgBuildLock {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        // Closing the connection releases the lock; without a runtime the
        // socket's close does it, as the server sees the client gone.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = connection.close().await;
            });
        }
    }
}
