//! Reading the Postgres change feed by snapshot visibility.
//!
//! A position is a snapshot (`pg_snapshot` as text). The changes after
//! position `seen` are the rows of transactions that `seen` did not see
//! and the reading statement does: exactly those that committed in
//! between, whatever their commit order. Rows of transactions still running
//! come in a later read.

use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row, ValueRef};

use super::position::PgPosition;
use crate::follow::changes::Changes;
use crate::follow::Read;
use crate::kept::KeptConnection;

/// The changes read and the feed's snapshot after them, in one statement,
/// for one feed or several (`$1`, `$2`, `$3`: the feeds' names, the
/// positions they read from, whether their keys are [`lowered`]):
/// `pg_current_snapshot()` is the statement's own snapshot, taken after the
/// locks it waited for only under READ COMMITTED, which it reports. Keys
/// travel as UTF-8 bytes (`bytea`, which no client encoding refuses), or as
/// stored in a SQL_ASCII database, which has no encoding to convert from.
///
/// Each feed's rows are one index scan of its own (the lateral subquery,
/// which `offset 0` keeps from being planned as a join over the whole
/// feed).
static READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    READ_STATEMENT
        .replace("LOWERED", &lowered("c.key"))
        .replace("TIMELINE", super::position::TIMELINE_NOW)
        .replace("REPLAYED", "true")
});

/// [`READ`] on a replica (a hot standby), which cannot name its timeline:
/// the primary's (`$5`), taken with its log position (`$6`) just before;
/// the read counts only if the replica has replayed past that position,
/// and reads no rows otherwise.
pub(super) static READ_ON_REPLICA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    READ_STATEMENT
        .replace("LOWERED", &lowered("c.key"))
        .replace("TIMELINE", "$5::text")
        .replace(
            "REPLAYED",
            "pg_catalog.pg_last_wal_replay_lsn() >= $6::pg_lsn",
        )
});

/// [`READ`] for one feed from a position that may be far behind (a
/// snapshot's or a scan's, at a catch-up), sent as a one-off statement:
/// planned for its own name and position, it probes the index by guard
/// and transaction id. The prepared [`READ`] runs, after its first
/// executions, on a generic plan, which may walk every guard's rows since
/// the position through the index by transaction id: cheap from the
/// loop's recent positions, not from one that predates a bulk load of
/// another guard's table.
static READ_BEHIND: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    READ.replace("where c.guard = m.guard", "where c.guard = ($1::text[])[1]")
        .replace(
            "c.xid >= pg_catalog.pg_snapshot_xmin(m.seen)",
            "c.xid >= pg_catalog.pg_snapshot_xmin((($2::text[])[1])::pg_snapshot)",
        )
});

const READ_STATEMENT: &str = "
with now as (
    select pg_catalog.pg_current_snapshot() as snapshot,
           TIMELINE as timeline,
           REPLAYED as replayed,
           (select below from bloom_guard.horizon) as below,
           case pg_catalog.current_setting('server_encoding') when 'SQL_ASCII' then 'SQL_ASCII' else 'UTF8' end as encoding,
           pg_catalog.current_setting('transaction_isolation') as isolation
), m as (
    select m.i, m.guard, m.lowered, m.seen::pg_snapshot as seen,
           pg_catalog.pg_snapshot_xmin(m.seen::pg_snapshot) < now.below as pruned,
           m.timeline is distinct from now.timeline
             or pg_catalog.pg_snapshot_xmax(m.seen::pg_snapshot) > pg_catalog.pg_snapshot_xmax(now.snapshot) as elsewhere
      from now, rows from (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::bool[]), pg_catalog.unnest($4::text[]))
           with ordinality as m(guard, seen, lowered, timeline, i)
)
select m.i, now.timeline || '/' || now.snapshot::text, m.pruned, c.kind::text,
       pg_catalog.convert_to(case when m.lowered then LOWERED else c.key end, now.encoding), now.isolation,
       m.elsewhere, now.timeline, now.replayed
  from now cross join m
  left join lateral (
      select c.kind, c.key
        from bloom_guard.changes c
       where c.guard = m.guard
         and now.replayed
         and not m.pruned
         and not m.elsewhere
         and c.xid >= pg_catalog.pg_snapshot_xmin(m.seen)
         and not pg_catalog.pg_visible_in_snapshot(c.xid, m.seen)
      offset 0) c on true";

/// A key of a case-insensitive guard as the database lowers it, where it
/// has characters other than ASCII (ASCII keys as they are: the guard
/// lowers those itself, and a Turkish locale lowers `I` otherwise): the
/// form `citext` compares, so a stored key with any characters is held
/// exactly. Under the default collation, as the feed's key column has.
pub(super) fn lowered(key: &str) -> String {
    format!(
        "case when pg_catalog.octet_length({key}) = pg_catalog.char_length({key}) then {key}::text else pg_catalog.lower({key}::text collate \"default\") end"
    )
}

/// Retention runs at this level, whatever the database's or the role's
/// default: under REPEATABLE READ a statement's snapshot would predate the
/// lock it waits for. And without parallel workers or JIT compilation (see
/// [`feed_connection`]). One round trip: all go as one simple query.
const READ_COMMITTED: &str = "begin isolation level read committed; set local max_parallel_workers_per_gather = 0; set local jit = off";

/// The application name of the connection feed reads go through.
pub const FEED_APPLICATION_NAME: &str = "bloom_guard_feed";

/// The startup parameters of a connection that reads the feed (the feed
/// connection, the notifier's): READ COMMITTED whatever the database's
/// default, no parallel workers, no JIT (see [`feed_connection`]).
pub(super) const READ_SESSION: [(&str, &str); 3] = [
    ("default_transaction_isolation", "read committed"),
    ("max_parallel_workers_per_gather", "0"),
    ("jit", "off"),
];

/// The options of the connection a follower keeps for its feed reads
/// ([`KeptConnection`]).
///
/// The session runs at READ COMMITTED whatever the database's or the
/// role's default (under REPEATABLE READ a statement's snapshot would
/// predate the lock it waits for, and miss the horizon a truncation behind
/// that lock moved), and without parallel workers or JIT compilation: a
/// read finds a handful of rows, but on a feed whose statistics predate a
/// bulk load the planner expects a third of the table and starts workers
/// or compiles the plan, which costs a read (and every refusal waiting on
/// the read barrier) milliseconds. All are startup parameters, so
/// connecting costs no extra round trip.
pub(super) fn feed_connection(pool: &PgPool) -> KeptConnection<PgConnection> {
    let pool = pool.clone();
    KeptConnection::new(
        move || {
            pool.connect_options()
                .as_ref()
                .clone()
                .application_name(FEED_APPLICATION_NAME)
                .options(READ_SESSION)
                .options([
                    ("tcp_keepalives_idle", "30"),
                    ("tcp_keepalives_interval", "10"),
                    ("tcp_keepalives_count", "3"),
                ])
        },
        None,
    )
}

/// One feed of a read: its name, whether its keys are [`lowered`], and
/// the position it reads from.
#[derive(Debug, Clone, Copy)]
pub(super) struct FeedRead<'a> {
    pub(super) name: &'a str,
    pub(super) lowered: bool,
    pub(super) seen: &'a PgPosition,
}

/// Reads the changes of `feeds` committed after their positions on the
/// kept connection, in one statement; a read that failed closes it.
pub(super) async fn read_kept(
    kept: &KeptConnection<PgConnection>,
    feeds: &[FeedRead<'_>],
) -> Result<Vec<Read<PgPosition>>, sqlx::Error> {
    crate::kept::again_if_lost(|| async {
        let mut lease = kept.lease().await?;
        let read = crate::kept::within_timeout(read_since(
            lease.connection(),
            (READ.as_str(), true),
            feeds,
        ))
        .await?;
        lease.keep();
        Ok(read)
    })
    .await
}

/// Reads the changes of `feed` committed after a position that may be far
/// behind, on the kept connection ([`READ_BEHIND`]).
pub(super) async fn read_kept_behind(
    kept: &KeptConnection<PgConnection>,
    feed: FeedRead<'_>,
) -> Result<Read<PgPosition>, sqlx::Error> {
    let mut read = crate::kept::again_if_lost(|| async {
        let mut lease = kept.lease().await?;
        let read =
            crate::kept::within_timeout(read_since(lease.connection(), behind(), &[feed])).await?;
        lease.keep();
        Ok(read)
    })
    .await?;
    read.pop().ok_or(sqlx::Error::RowNotFound)
}

/// The statement of a read from far behind, and whether it is prepared:
/// [`READ_BEHIND`], one-off, so planned for its own name and position.
fn behind() -> (&'static str, bool) {
    (READ_BEHIND.as_str(), false)
}

/// Reads the changes of `feeds` committed after their positions, in one
/// statement (`statement`, prepared or one-off): its own snapshot, under
/// the session's READ COMMITTED.
async fn read_since(
    connection: &mut PgConnection,
    (statement, prepared): (&'static str, bool),
    feeds: &[FeedRead<'_>],
) -> Result<Vec<Read<PgPosition>>, sqlx::Error> {
    read_marked(connection, (statement, prepared), feeds, None)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// The primary's timeline and log position, taken just before a read on a
/// replica.
#[derive(Debug, Clone)]
pub(super) struct PrimaryMark {
    pub(super) timeline: String,
    pub(super) lsn: String,
}

/// [`read_since`], on a replica with `mark`: `None` if the replica has not
/// replayed past it.
pub(super) async fn read_marked(
    connection: &mut PgConnection,
    (statement, prepared): (&'static str, bool),
    feeds: &[FeedRead<'_>],
    mark: Option<&PrimaryMark>,
) -> Result<Option<Vec<Read<PgPosition>>>, sqlx::Error> {
    let names: Vec<&str> = feeds.iter().map(|feed| feed.name).collect();
    let seen: Vec<&str> = feeds.iter().map(|feed| feed.seen.snapshot()).collect();
    let lowered: Vec<bool> = feeds.iter().map(|feed| feed.lowered).collect();
    let timelines: Vec<&str> = feeds.iter().map(|feed| feed.seen.timeline()).collect();
    let query = sqlx::query(AssertSqlSafe(statement))
        .bind(names)
        .bind(seen)
        .bind(lowered)
        .bind(timelines);
    let query = match mark {
        Some(mark) => query.bind(&mark.timeline).bind(&mark.lsn),
        None => query,
    };
    let mut rows = query.persistent(prepared).fetch(connection);
    let mut position = None;
    // Each feed's changes, `None` once its rows were pruned.
    let mut read: Vec<Option<Changes>> = feeds.iter().map(|_| Some(Changes::default())).collect();
    let mut answered = vec![false; feeds.len()];
    while let Some(row) = rows.try_next().await? {
        if position.is_none() {
            let isolation: String = row.try_get(5)?;
            if isolation != "read committed" {
                // A pooler dropped the startup parameters, and the role's
                // default isolation would let the read miss a truncation.
                return Err(sqlx::Error::Configuration(
                    format!("the change feed connection runs at {isolation}, not read committed: connect without a pooler that drops startup parameters").into(),
                ));
            }
            let text = row.try_get::<String, _>(1)?;
            position = Some(PgPosition::decode(&text)?);
            if !row.try_get::<bool, _>(8)? {
                // The replica has not replayed what the primary had.
                return Ok(None);
            }
        }
        let feed = usize::try_from(row.try_get::<i64, _>(0)?)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .filter(|&i| i < feeds.len())
            .ok_or(sqlx::Error::RowNotFound)?;
        answered[feed] = true;
        if row.try_get::<bool, _>(6)? {
            if read[feed].is_some() {
                let timeline: String = row.try_get(7)?;
                let seen = feeds[feed].seen;
                tracing::warn!(
                    feed = feeds[feed].name,
                    position = %seen,
                    timeline,
                    "the change feed's position belongs to another timeline of the server, or lies ahead of it (a failover that lost commits, or a restore): rebuilding"
                );
            }
            read[feed] = None;
            continue;
        }
        if row.try_get::<bool, _>(2)? {
            read[feed] = None;
            continue;
        }
        let (Some(changes), Some(kind)) = (&mut read[feed], row.try_get::<Option<String>, _>(3)?)
        else {
            continue; // the one row of a feed without changes
        };
        let raw = row.try_get_raw(4)?;
        let key = if raw.is_null() {
            &[][..]
        } else {
            raw.as_bytes().map_err(sqlx::Error::Decode)?
        };
        changes.record(&kind, Some(key));
    }
    let position = position.ok_or(sqlx::Error::RowNotFound)?;
    if answered.contains(&false) {
        return Err(sqlx::Error::RowNotFound);
    }
    Ok(Some(
        read.into_iter()
            .map(|changes| match changes {
                Some(changes) => Read::Changes {
                    position: position.clone(),
                    changes,
                },
                None => Read::Pruned,
            })
            .collect(),
    ))
}

/// Counts the rows of feed `name` committed after position `seen`, up to
/// `limit`: what [`read_since`] would read, without reading it.
pub(super) async fn pending(
    pool: &PgPool,
    name: &str,
    seen: &PgPosition,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    let count: i64 = sqlx::query_scalar(
        "select count(*) from (
            select from bloom_guard.changes c
            where c.guard = $1
              and c.xid >= pg_catalog.pg_snapshot_xmin($2::pg_snapshot)
              and not pg_catalog.pg_visible_in_snapshot(c.xid, $2::pg_snapshot)
            limit $3) as pending",
    )
    .bind(name)
    .bind(seen.snapshot())
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    // Planned for its own guard and position, as READ_BEHIND.
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(count.max(0) as u64)
}

/// Prunes the rows every reader has had for `retention`; one instance at a
/// time does the work.
pub(super) async fn prune(pool: &PgPool, retention: Duration) -> Result<i64, sqlx::Error> {
    // READ COMMITTED: the function's statements see what committed while
    // it waited for a slot's lock (a writer finishing in the slot).
    let mut tx = pool.begin_with(READ_COMMITTED).await?;
    let removed = sqlx::query_scalar("select bloom_guard.prune(make_interval(secs => $1))")
        .bind(retention.as_secs_f64())
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(removed)
}

/// The feed's partitions with their indexes, in bytes, and how long the
/// oldest retired slot has been due for emptying under `retention` (whole
/// seconds, 0 when none is): one catalog and one three-row read.
pub(super) async fn storage(
    pool: &PgPool,
    retention: Duration,
) -> Result<bloom_guard::stats::FeedStorage, sqlx::Error> {
    let (bytes, overdue): (i64, f64) = sqlx::query_as(
        "select (select coalesce(sum(pg_catalog.pg_total_relation_size(i.inhrelid)), 0)::int8
                   from pg_catalog.pg_inherits i
                  where i.inhparent = 'bloom_guard.changes'::regclass),
                coalesce(max(extract(epoch from pg_catalog.now() - s.since)::float8 - $1)
                         filter (where not s.current and s.retired is not null), 0)
           from bloom_guard.slots s",
    )
    .bind(retention.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok(bloom_guard::stats::FeedStorage::new(
        u64::try_from(bytes).unwrap_or(0),
        overdue.max(0.0) as u64,
    ))
}

#[cfg(test)]
mod tests;
