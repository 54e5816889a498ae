//! Filter snapshots in `bloom_guard.snapshots`: publishing, finding the
//! newest, loading one chunk by chunk, and the lock that makes one
//! instance of a fleet build at a time.

use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, PgPool};

use crate::follow::Clock;
use crate::postgres::position::{PgPosition, POSITION_NOW};
use crate::store::session_lock::SessionLock;
use crate::store::snapshots::Statements;

/// What names a guard's key set: the database (cluster and database, as a
/// feed position means nothing elsewhere) and the key query.
pub(crate) async fn fingerprint(
    pool: &PgPool,
    key_query: &str,
    versions: &str,
) -> Result<String, sqlx::Error> {
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
        .chain_update([0])
        .chain_update(versions.as_bytes())
        .finalize();
    Ok(digest.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The snapshot tables' statements.
pub(crate) const STATEMENTS: Statements = Statements {
    newest: "select id, len,
                (extract(epoch from scanned_at) * 1000000)::int8,
                extract(epoch from pg_catalog.now() - created_at)::float8
           from bloom_guard.snapshots
          where guard = $1 and format between 2 and $2 and fingerprint = $3
          order by id desc limit 1",
    chunks: "select data from bloom_guard.snapshot_chunks where snapshot = $1 order by seq",
    insert: "insert into bloom_guard.snapshots (guard, format, fingerprint, position, scanned_at, len, keys)
             values ($1, $2, $3, $4, pg_catalog.to_timestamp($5::float8 / 1000000), $6, $7)
             returning id",
    inserted_id: None,
    insert_chunk: "insert into bloom_guard.snapshot_chunks (snapshot, seq, data) values ($1, $2, $3)",
    after: &[
        // The newest two are kept (chunks go with their snapshot).
        "delete from bloom_guard.snapshots
          where guard = $1 and id not in (
                select id from bloom_guard.snapshots where guard = $1 order by id desc limit 2)",
        // Wakes the other instances, which adopt it.
        "select pg_catalog.pg_notify('bloom_guard', $1)",
    ],
};

/// The feed's position and the database's clock (µs since the epoch), in
/// one statement.
pub(crate) async fn position_now(pool: &PgPool) -> Result<Clock<PgPosition>, sqlx::Error> {
    let (text, at): (String, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "select {POSITION_NOW}, (extract(epoch from pg_catalog.clock_timestamp()) * 1000000)::int8"
    )))
    .fetch_one(pool)
    .await?;
    let position = PgPosition::decode(&text)?;
    Ok(Clock { position, at })
}

/// The fleet-wide lock on building `guard`'s filter: a session advisory
/// lock on a connection of its own, released when the connection closes,
/// so a crashed holder never keeps it. Dropped, it closes its connection.
pub(crate) type PgBuildLock = SessionLock<PgConnection>;

const LOCK_SQL: &str = "select pg_catalog.pg_advisory_lock(pg_catalog.hashtext('bloom_guard.build'), pg_catalog.hashtext($1))";
const TRY_LOCK_SQL: &str = "select pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('bloom_guard.build'), pg_catalog.hashtext($1))";

/// Waits for the build lock of `guard`.
pub(crate) async fn build_lock(pool: &PgPool, guard: &str) -> Result<PgBuildLock, sqlx::Error> {
    let mut connection = crate::postgres::connections::own_connection(pool).await?;
    sqlx::query(LOCK_SQL)
        .bind(guard)
        .execute(&mut connection)
        .await?;
    Ok(SessionLock::new(connection))
}

/// The build lock of `guard`, if nobody holds it.
pub(crate) async fn try_build_lock(
    pool: &PgPool,
    guard: &str,
) -> Result<Option<PgBuildLock>, sqlx::Error> {
    let mut connection = crate::postgres::connections::own_connection(pool).await?;
    let locked: bool = sqlx::query_scalar(TRY_LOCK_SQL)
        .bind(guard)
        .fetch_one(&mut connection)
        .await?;
    if !locked {
        connection.close().await?;
        return Ok(None);
    }
    Ok(Some(SessionLock::new(connection)))
}
