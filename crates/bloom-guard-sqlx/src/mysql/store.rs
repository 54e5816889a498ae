//! Snapshots and the fleet's settings and heartbeats in MySQL tables, and
//! the fleet's build lock (`GET_LOCK`).

use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, MySqlPool};

use crate::store::fleet::FleetStatements;
use crate::store::session_lock::SessionLock;
use crate::store::snapshots::Statements;

/// The fingerprint of the key query in the database of `identity` (a
/// random id written at install), under the feed triggers' `versions`.
pub(super) fn fingerprint(identity: &str, key_query: &str, versions: &str) -> String {
    crate::digest::parts_digest(&[identity, key_query, versions])
}

/// The snapshot tables' statements. MySQL cannot return an inserted id,
/// nor name in a subquery the table a statement deletes from: the newest
/// two are kept by the id of the second newest, in a session variable.
pub(super) const STATEMENTS: Statements = Statements {
    newest: "select id, len, scanned_at, unix_timestamp(now(6)) - created_at + 0e0
           from bloom_guard_snapshots
          where guard = ? and format between 2 and ? and fingerprint = ?
          order by id desc limit 1",
    chunks: "select data from bloom_guard_snapshot_chunks where snapshot = ? order by seq",
    insert: "insert into bloom_guard_snapshots
                (guard, format, fingerprint, position, scanned_at, len, `keys`, created_at)
             values (?, ?, ?, ?, ?, ?, ?, unix_timestamp(now(6)))",
    inserted_id: Some("select cast(last_insert_id() as signed)"),
    insert_chunk: "insert into bloom_guard_snapshot_chunks (snapshot, seq, data) values (?, ?, ?)",
    after: &[
        "set @bloom_guard_keep = (select id from bloom_guard_snapshots
                                   where guard = ? order by id desc limit 1 offset 1)",
        "delete from bloom_guard_snapshot_chunks where snapshot in
           (select id from bloom_guard_snapshots where guard = ? and id < @bloom_guard_keep)",
        "delete from bloom_guard_snapshots where guard = ? and id < @bloom_guard_keep",
    ],
};

/// Milliseconds since the epoch, the server's clock.
macro_rules! now_ms {
    () => {
        "cast(unix_timestamp(now(3)) * 1000 as signed)"
    };
}

/// The fleet tables' statements; an instance is live for 30 s after its
/// heartbeat.
pub(super) const FLEET: FleetStatements = FleetStatements {
    settings: "select mode, audit_rate from bloom_guard_settings where guard = ?",
    store: concat!(
        "insert into bloom_guard_settings (guard, mode, audit_rate, updated_at)
         values (?, ?, ?, ",
        now_ms!(),
        ")
         on duplicate key update
            mode = coalesce(values(mode), mode),
            audit_rate = coalesce(values(audit_rate), audit_rate),
            updated_at = values(updated_at)"
    ),
    reset: "delete from bloom_guard_settings where guard = ?",
    beat: concat!(
        "insert into bloom_guard_instances (guard, id, report, seen_at)
         values (?, ?, ?, ",
        now_ms!(),
        ")
         on duplicate key update report = values(report), seen_at = values(seen_at)"
    ),
    expire: concat!(
        "delete from bloom_guard_instances where guard = ? and seen_at < ",
        now_ms!(),
        " - 30000"
    ),
    instances: concat!(
        "select report, ",
        now_ms!(),
        " - seen_at from bloom_guard_instances where guard = ? and seen_at >= ",
        now_ms!(),
        " - 30000 order by id"
    ),
    leave: "delete from bloom_guard_instances where guard = ? and id = ?",
};

/// The lock on building a guard's filter, held by one instance of the
/// fleet: a `GET_LOCK` on a connection of its own, released when the lock
/// is dropped or the connection dies (a crashed holder frees it).
pub(crate) type MySqlBuildLock = SessionLock<MySqlConnection>;

/// Lock names are server-wide and at most 64 characters: the database's
/// and the guard's names are hashed, so guards of one name in two
/// databases do not wait on each other.
const LOCK_SQL: &str =
    "select get_lock(concat('bloom_guard.build.', left(sha2(concat(database(), '/', ?), 256), 40)), ?)";

/// Waits for the build lock of `guard`.
pub(super) async fn build_lock(
    pool: &MySqlPool,
    guard: &str,
) -> Result<MySqlBuildLock, sqlx::Error> {
    loop {
        // A day at a time: GET_LOCK's timeout is in seconds, and servers
        // differ on what a negative one means.
        if let Some(lock) = take(pool, guard, 86_400).await? {
            return Ok(lock);
        }
    }
}

/// The build lock of `guard`, if nobody holds it.
pub(super) async fn try_build_lock(
    pool: &MySqlPool,
    guard: &str,
) -> Result<Option<MySqlBuildLock>, sqlx::Error> {
    take(pool, guard, 0).await
}

async fn take(
    pool: &MySqlPool,
    guard: &str,
    wait_secs: i64,
) -> Result<Option<MySqlBuildLock>, sqlx::Error> {
    let mut connection = MySqlConnection::connect_with(&pool.connect_options()).await?;
    let locked: Option<i64> = sqlx::query_scalar(LOCK_SQL)
        .bind(guard)
        .bind(wait_secs)
        .fetch_one(&mut connection)
        .await?;
    if locked != Some(1) {
        connection.close().await?;
        return Ok(None);
    }
    Ok(Some(SessionLock::new(connection)))
}
