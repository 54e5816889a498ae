//! Filter snapshots in a SQLite database, for instances sharing one file:
//! the same contract as on Postgres, with a leased lock row in place of an
//! advisory lock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::SqlitePool;

use tokio_util::task::AbortOnDropHandle;

use crate::store::snapshots::Statements;

/// The snapshot tables and the lock table. Idempotent.
pub(crate) const TABLES: &str = "
create table if not exists bloom_guard_snapshots (
    id integer primary key autoincrement,
    guard text not null,
    format integer not null,
    fingerprint text not null,
    position text not null,
    scanned_at integer not null,
    created_at integer not null default (cast(strftime('%s', 'now') as integer)),
    len integer not null,
    keys integer not null
);
create table if not exists bloom_guard_snapshot_chunks (
    snapshot integer not null,
    seq integer not null,
    data blob not null,
    primary key (snapshot, seq)
);
create table if not exists bloom_guard_locks (
    name text primary key,
    holder text not null,
    until integer not null
);
";

/// A lock's lease, renewed while held: a holder that dies frees it when
/// the lease runs out.
const LEASE: Duration = Duration::from_secs(30);

/// Microseconds since the epoch.
pub(crate) fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

/// The fingerprint of the key query in the database file of `identity`
/// (a random id written into the file at install): a snapshot copied in
/// from another file, whose feed positions mean nothing here, is not this
/// guard's.
pub(crate) fn fingerprint(identity: &str, key_query: &str) -> String {
    crate::digest::parts_digest(&[identity, key_query])
}

/// The snapshot tables' statements.
pub(crate) const STATEMENTS: Statements = Statements {
    newest: "select id, len, scanned_at, cast(strftime('%s', 'now') as integer) - created_at + 0.0
           from bloom_guard_snapshots
          where guard = ?1 and format between 2 and ?2 and fingerprint = ?3
          order by id desc limit 1",
    chunks: "select data from bloom_guard_snapshot_chunks where snapshot = ?1 order by seq",
    insert: "insert into bloom_guard_snapshots (guard, format, fingerprint, position, scanned_at, len, keys)
             values (?1, ?2, ?3, ?4, ?5, ?6, ?7) returning id",
    inserted_id: None,
    insert_chunk: "insert into bloom_guard_snapshot_chunks (snapshot, seq, data) values (?1, ?2, ?3)",
    // The newest two are kept, chunks first.
    after: &[
        "delete from bloom_guard_snapshot_chunks where snapshot in
           (select id from bloom_guard_snapshots where guard = ?1 and id not in
              (select id from bloom_guard_snapshots where guard = ?1 order by id desc limit 2))",
        "delete from bloom_guard_snapshots where guard = ?1 and id not in
           (select id from bloom_guard_snapshots where guard = ?1 order by id desc limit 2)",
    ],
};

/// The lock on building a guard's filter, held by one instance of those
/// sharing the file; renewed while held, released on drop (a follower
/// stopped half-way through a build frees it at once, not at the end of
/// its lease).
pub(crate) struct SqliteBuildLock {
    pool: SqlitePool,
    name: String,
    holder: String,
    _renew: AbortOnDropHandle<()>,
}

impl SqliteBuildLock {
    /// Waits for the lock.
    /// Waits for the lock. A busy database (another connection writing)
    /// is waited out too, for up to a lease.
    pub(crate) async fn acquire(pool: &SqlitePool, guard: &str) -> Result<Self, sqlx::Error> {
        let deadline = tokio::time::Instant::now() + LEASE;
        loop {
            match Self::try_acquire(pool, guard).await {
                Ok(Some(lock)) => return Ok(lock),
                Ok(None) => {}
                Err(error) if tokio::time::Instant::now() >= deadline => return Err(error),
                Err(error) => tracing::debug!(%error, "cannot take the build lock yet"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The lock if nobody holds it (or its holder's lease ran out).
    pub(crate) async fn try_acquire(
        pool: &SqlitePool,
        guard: &str,
    ) -> Result<Option<Self>, sqlx::Error> {
        let holder = format!("{}-{}", std::process::id(), fastrand::u64(..));
        let name = format!("build:{guard}");
        let now = now_micros();
        let taken = sqlx::query(
            "insert into bloom_guard_locks (name, holder, until) values (?, ?, ?)
             on conflict (name) do update set holder = excluded.holder, until = excluded.until
             where bloom_guard_locks.until < ?",
        )
        .bind(&name)
        .bind(&holder)
        .bind(now + LEASE.as_micros() as i64)
        .bind(now)
        .execute(pool)
        .await?
        .rows_affected();
        if taken == 0 {
            return Ok(None);
        }
        let renew = {
            let (pool, name, holder) = (pool.clone(), name.clone(), holder.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LEASE / 3).await;
                    let _ = sqlx::query(
                        "update bloom_guard_locks set until = ? where name = ? and holder = ?",
                    )
                    .bind(now_micros() + LEASE.as_micros() as i64)
                    .bind(&name)
                    .bind(&holder)
                    .execute(&pool)
                    .await;
                }
            })
        };
        Ok(Some(Self {
            pool: pool.clone(),
            name,
            holder,
            _renew: AbortOnDropHandle::new(renew),
        }))
    }
}

impl Drop for SqliteBuildLock {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unlock(
                self.pool.clone(),
                self.name.clone(),
                self.holder.clone(),
            ));
        }
    }
}

async fn unlock(pool: SqlitePool, name: String, holder: String) {
    let _ = sqlx::query("delete from bloom_guard_locks where name = ? and holder = ?")
        .bind(&name)
        .bind(&holder)
        .execute(&pool)
        .await;
}
