//! Reading the log feed: the rows after a position, and the read barrier
//! by log position.
//!
//! A position is the end of a commit: every change committed up to it is
//! in the rows at or before it, none after. A read's new position is the
//! furthest the producer has written that the read's snapshot can see:
//! its progress row (written with its rows), or the slot's confirmed
//! position if that was seen before the read's statement (the producer
//! confirms only what it wrote, and an idle stream's end, with nothing to
//! write).
//!
//! The barrier: a commit visible before a request arrived ends at or
//! before the server's insert position taken after it arrived. A read for
//! the barrier reads only once the slot's confirmed position reaches that
//! (the producer has written every commit up to it): no commit the
//! producer has not decoded yet is refused as absent. One statement looks
//! at the slot and, when it is there, reads in a snapshot taken after the
//! look (`bloom_guard.log_read`): one round trip when the producer is not
//! behind.

use std::time::Duration;

use futures_util::TryStreamExt as _;
use sqlx::{PgConnection, Row as _};

use super::rows::FeedRow;

/// How often a barrier's read looks at the slot while the producer is
/// behind.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// The rows of a read, and its new position.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LogRead {
    pub(crate) rows: Vec<FeedRow>,
    pub(crate) position: u64,
    /// Rows at or before this were pruned, as the read's snapshot saw:
    /// a read from before it missed some.
    pub(crate) horizon: u64,
    /// The feed's epoch as the read's snapshot saw ([`EPOCH`](super::slot::EPOCH)):
    /// a position of another epoch is not this feed's.
    pub(crate) epoch: String,
    /// The producer's commit-to-feed lag as of its last write the read's
    /// snapshot sees.
    pub(crate) lag: Option<Duration>,
}

/// Why a read of the log feed failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogReadError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("the log feed's slot {0} is missing")]
    NoSlot(String),
    #[error("the log feed's producer did not reach the log's position {0:#x} in time")]
    Behind(u64),
    #[error("the log feed cannot carry every change of {0} (unlogged or foreign members of its family, a fed ancestor it is published as, or the publication changed outside install_log), so no read can refuse their keys")]
    Unseen(String),
}

/// The guards' rows after `after`; with `barrier`, only once the producer
/// has written every commit before the call, waiting at most that long.
#[cfg(test)]
pub(crate) async fn read(
    connection: &mut PgConnection,
    slot: &str,
    guards: &[&str],
    after: u64,
    barrier: Option<Duration>,
    lowered: bool,
) -> Result<LogRead, LogReadError> {
    let feeds: Vec<_> = guards
        .iter()
        .map(|&guard| FeedAt {
            guard,
            after,
            lowered,
        })
        .collect();
    let mut reads = read_feeds(connection, slot, &feeds, barrier)
        .await?
        .into_iter();
    let mut read = reads.next().unwrap_or_default();
    for other in reads {
        read.rows.extend(other.rows);
    }
    Ok(read)
}

/// One guard's feed to read: its rows after `after`, keys [`lowered`](crate::postgres::feed::lowered) or not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedAt<'a> {
    pub(crate) guard: &'a str,
    pub(crate) after: u64,
    pub(crate) lowered: bool,
}

/// Each feed's rows after its position, in one statement (the refusals of
/// several guards served by one read); with `barrier`, once the producer
/// has written every commit before the call, waiting at most that long.
/// The reads in the order of `feeds`.
pub(crate) async fn read_feeds(
    connection: &mut PgConnection,
    slot: &str,
    feeds: &[FeedAt<'_>],
    barrier: Option<Duration>,
) -> Result<Vec<LogRead>, LogReadError> {
    let guards: Vec<&str> = feeds.iter().map(|feed| feed.guard).collect();
    let afters: Vec<String> = feeds.iter().map(|feed| lsn_text(feed.after)).collect();
    let lowered: Vec<bool> = feeds.iter().map(|feed| feed.lowered).collect();
    let deadline = barrier.map(|bound| tokio::time::Instant::now() + bound);
    // The statement's target once known: the first statement takes the
    // insert position itself, a later one waits for the same.
    let mut target: Option<u64> = None;
    loop {
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(READ.as_str()))
            .bind(slot)
            .bind(&guards)
            .bind(barrier.is_some())
            .bind(&afters)
            .bind(&lowered)
            .bind(target.map(|lsn| i64::try_from(lsn).unwrap_or(i64::MAX)))
            .fetch(&mut *connection);
        let mut reads: Vec<LogRead> = feeds.iter().map(|_| LogRead::default()).collect();
        let mut behind = None;
        while let Some(row) = rows.try_next().await? {
            let confirmed = row
                .try_get::<Option<i64>, _>(0)?
                .ok_or_else(|| LogReadError::NoSlot(slot.to_owned()))?
                .unsigned_abs();
            let aim = row.try_get::<i64, _>(1)?.unsigned_abs();
            if confirmed < aim {
                behind = Some(aim);
                break;
            }
            if let Some(members) = row.try_get::<Option<String>, _>(2)? {
                // Rows written there reach no read: a refusal could be wrong.
                return Err(LogReadError::Unseen(members));
            }
            let Some(n) = row.try_get::<Option<i64>, _>(3)? else {
                continue;
            };
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let Some(read) = n.checked_sub(1).and_then(|n| reads.get_mut(n)) else {
                continue;
            };
            read.position = row.try_get::<i64, _>(4)?.unsigned_abs();
            read.horizon = row.try_get::<i64, _>(5)?.unsigned_abs();
            read.epoch = row.try_get(6)?;
            read.lag = row
                .try_get::<Option<f64>, _>(7)?
                .filter(|lag| lag.is_finite() && *lag >= 0.0)
                .map(Duration::from_secs_f64);
            let Some(guard) = row.try_get::<Option<String>, _>(8)? else {
                continue;
            };
            let kind: String = row.try_get(9)?;
            read.rows.push(FeedRow {
                guard,
                kind: kind.bytes().next().unwrap_or(b'r'),
                key: row.try_get(10)?,
            });
        }
        drop(rows);
        let Some(aim) = behind else {
            return Ok(reads);
        };
        // The producer has not written every commit up to the target: look
        // at the slot alone until it has, then read.
        target = Some(aim);
        loop {
            if deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
                return Err(LogReadError::Behind(aim));
            }
            tokio::time::sleep(LOOK_EVERY).await;
            if confirmed(&mut *connection, slot).await? >= aim {
                break;
            }
        }
    }
}

/// The statement of a read: the slot's confirmed position and the read's
/// target (with a barrier, the server's insert position now, or the
/// target given; else none), then, when the slot's position reaches the
/// target, each feed's rows from [`bloom_guard.log_read`], which takes
/// its snapshot after this look (the producer confirms only what it
/// wrote). Its columns: the confirmed position, the target, the family
/// members no read can see, then per row the feed's number, its new
/// position, the horizon, the epoch, the lag, and the row's guard, kind
/// and key.
static READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    READ_STATEMENT
        .replace(
            "LOWERED",
            &format!(
                "case when ($5::bool[])[r.n] then {} else r.key end",
                crate::postgres::feed::lowered("r.key")
            ),
        )
        .replace(
            "RECORD_END",
            &record_end_at_or_before("l.insert", "l.block"),
        )
        .replace("UNSEEN", &super::publication::unseen_in("l.rel"))
        .replace("DRIFT", &super::publication::publication_drift("l.rel"))
        .replace("ANCESTORS", &super::publication::fed_ancestors("l.rel"))
});

const READ_STATEMENT: &str = "with look as (
             select (select s.confirmed_flush_lsn from pg_catalog.pg_replication_slots s
                      where s.slot_name = $1) as confirmed,
                    pg_catalog.pg_current_wal_insert_lsn() as insert,
                    pg_catalog.current_setting('wal_block_size')::pg_catalog.int8 as block),
              aim as (
             select l.confirmed,
                    case when not $3 then '0/0'::pg_catalog.pg_lsn
                         when $6::pg_catalog.int8 is not null
                         then '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $6::pg_catalog.numeric
                         else RECORD_END end as target
               from look l),
              unseen as (
             select pg_catalog.string_agg(l.rel::pg_catalog.regclass::pg_catalog.text operator(pg_catalog.||) ': ' operator(pg_catalog.||) x.what, '; ') as members
               from bloom_guard.logged l
              cross join lateral (select coalesce(UNSEEN, DRIFT, ANCESTORS) as what) x
              where l.guard operator(pg_catalog.=) any ($2::text[]) and x.what is not null)
         select (a.confirmed operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                (a.target operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                (select members from unseen),
                r.n,
                (r.upto operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                (coalesce(r.below, '0/0') operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                r.epoch, r.lag, r.guard, r.kind::pg_catalog.text, LOWERED
           from aim a
           left join lateral bloom_guard.log_read(
                    $1,
                    case when a.confirmed operator(pg_catalog.>=) a.target then a.confirmed end,
                    $2::text[], $4::pg_catalog.pg_lsn[])
                with ordinality as r(n, upto, below, epoch, lag, guard, kind, key, ord) on true
          order by r.ord";

/// The slot's confirmed position.
async fn confirmed(connection: &mut PgConnection, slot: &str) -> Result<u64, LogReadError> {
    let confirmed: Option<i64> = sqlx::query_scalar(
        "select (select (s.confirmed_flush_lsn operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8
                   from pg_catalog.pg_replication_slots s where s.slot_name = $1)",
    )
    .bind(slot)
    .fetch_one(connection)
    .await?;
    confirmed
        .map(i64::unsigned_abs)
        .ok_or_else(|| LogReadError::NoSlot(slot.to_owned()))
}

/// The furthest a record can end at or before the insert position
/// `insert` (a `pg_lsn` expression), in SQL: the server's insert position
/// just after a page's header is where the page's first record would
/// start, and no record ends inside a header, so a log whose last record
/// fills its page up to the end is decoded up to that end. A page header
/// is 24 bytes; the first page of a segment's, 40. `block` is the log's
/// page size (`wal_block_size`, an int8 expression).
pub(super) fn record_end_at_or_before(insert: &str, block: &str) -> String {
    format!(
        "({insert} operator(pg_catalog.-) (case when (({insert} operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8
                                                      operator(pg_catalog.%) {block}) operator(pg_catalog.=) any (array[24, 40]::pg_catalog.int8[])
                                                 then (({insert} operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8
                                                       operator(pg_catalog.%) {block})
                                                 else 0 end)::pg_catalog.numeric)"
    )
}

/// The furthest position the producer has written, or the horizon if it
/// is further (what came before is in no row, nor to be read): every
/// change committed up to it is behind it. With the feed's epoch, in the
/// same snapshot.
pub(crate) async fn written(
    executor: impl sqlx::PgExecutor<'_>,
    slot: &str,
) -> Result<(u64, String), sqlx::Error> {
    let (written, epoch): (Option<i64>, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select (greatest((select p.applied from bloom_guard.log_progress p where p.slot = $1),
                          (select h.below from bloom_guard.log_horizon h),
                          '0/0'::pg_catalog.pg_lsn)
                 operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                {}",
        super::slot::EPOCH
    )))
    .bind(slot)
    .fetch_one(executor)
    .await?;
    Ok((written.map_or(0, i64::unsigned_abs), epoch))
}

/// How many rows of `guard` after `since`, counting up to `limit` only.
pub(crate) async fn pending(
    pool: &sqlx::PgPool,
    guard: &str,
    since: u64,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(
        "select count(*) from (select from bloom_guard.log_changes c
                                where c.guard = $1 and c.lsn operator(pg_catalog.>) $2::pg_catalog.pg_lsn
                                limit $3) as pending",
    )
    .bind(guard)
    .bind(lsn_text(since))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_one(pool)
    .await?;
    Ok(count.unsigned_abs())
}

/// Removes the rows written longer than `retention` ago, moving the
/// horizon past them, on one instance at a time; how many.
pub(crate) async fn prune(pool: &sqlx::PgPool, retention: Duration) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let locked: bool = sqlx::query_scalar(
        "select pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('bloom_guard.log_prune'))",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !locked {
        return Ok(0);
    }
    let pruned: (i64,) = sqlx::query_as(
        "with gone as (
             delete from bloom_guard.log_changes
              where written_at operator(pg_catalog.<) pg_catalog.now() operator(pg_catalog.-) $1::pg_catalog.interval
             returning lsn),
         moved as (
             update bloom_guard.log_horizon h set below = (select max(lsn) from gone)
              where (select max(lsn) from gone) operator(pg_catalog.>) h.below)
         select count(*) from gone",
    )
    .bind(format!("{} milliseconds", retention.as_millis()))
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(pruned.0)
}

/// An LSN as Postgres writes it.
pub(crate) fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_lsn_is_written_as_postgres_writes_it() {
        assert_eq!(lsn_text(0x1_0000_00A8), "1/A8");
    }
}
