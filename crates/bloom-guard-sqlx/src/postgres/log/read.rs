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
//! the barrier first waits until the slot's confirmed position reaches
//! that (the producer has written every commit up to it), then reads: no
//! commit the producer has not decoded yet is refused as absent.

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
    let (mut confirmed, now, block) = look(connection, slot).await?;
    if let Some(bound) = barrier {
        let target = record_end_at_or_before(now, block);
        let deadline = tokio::time::Instant::now() + bound;
        while confirmed < target {
            if tokio::time::Instant::now() >= deadline {
                return Err(LogReadError::Behind(target));
            }
            tokio::time::sleep(LOOK_EVERY).await;
            confirmed = look(connection, slot).await?.0;
        }
    }
    let guards: Vec<&str> = feeds.iter().map(|feed| feed.guard).collect();
    let afters: Vec<String> = feeds.iter().map(|feed| lsn_text(feed.after)).collect();
    let lowered: Vec<bool> = feeds.iter().map(|feed| feed.lowered).collect();
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(READ.as_str()))
        .bind(slot)
        .bind(&guards)
        .bind(lsn_text(confirmed))
        .bind(&afters)
        .bind(&lowered)
        .fetch(connection);
    let mut reads: Vec<LogRead> = feeds.iter().map(|_| LogRead::default()).collect();
    while let Some(row) = rows.try_next().await? {
        if let Some(members) = row.try_get::<Option<String>, _>(7)? {
            // Rows written there reach no read: a refusal could be wrong.
            return Err(LogReadError::Unseen(members));
        }
        let n = usize::try_from(row.try_get::<i64, _>(6)?).unwrap_or(usize::MAX);
        let Some(read) = n.checked_sub(1).and_then(|n| reads.get_mut(n)) else {
            continue;
        };
        read.position = row.try_get::<i64, _>(0)?.unsigned_abs();
        read.horizon = row.try_get::<i64, _>(4)?.unsigned_abs();
        read.epoch = row.try_get(5)?;
        read.lag = row
            .try_get::<Option<f64>, _>(8)?
            .filter(|lag| lag.is_finite() && *lag >= 0.0)
            .map(Duration::from_secs_f64);
        let Some(guard) = row.try_get::<Option<String>, _>(1)? else {
            continue;
        };
        let kind: String = row.try_get(2)?;
        read.rows.push(FeedRow {
            guard,
            kind: kind.bytes().next().unwrap_or(b'r'),
            key: row.try_get(3)?,
        });
    }
    Ok(reads)
}

/// Each feed's rows after its position, up to the furthest the producer
/// wrote that the statement's snapshot sees (its progress, or the
/// confirmed position seen before; a feed's own position if further),
/// with that position on every row, and the feed's number.
static READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    READ_STATEMENT
        .replace(
            "LOWERED",
            &format!(
                "case when f.lowered then {} else c.key end",
                crate::postgres::feed::lowered("c.key")
            ),
        )
        .replace("EPOCH", super::slot::EPOCH)
        .replace("UNSEEN", &super::install::unseen_in("l.rel"))
        .replace("DRIFT", &super::install::publication_drift("l.rel"))
        .replace("ANCESTORS", &super::install::fed_ancestors("l.rel"))
});

const READ_STATEMENT: &str = "with upto as (
             select greatest(
                        (select p.applied from bloom_guard.log_progress p where p.slot = $1),
                        $3::pg_catalog.pg_lsn) as lsn,
                    (select h.below from bloom_guard.log_horizon h) as below,
                    (select pg_catalog.date_part('epoch', p.lag) from bloom_guard.log_progress p where p.slot = $1) as lag,
                    EPOCH as epoch),
              feeds as (
             select f.guard, f.after::pg_catalog.pg_lsn as after, f.lowered, f.n
               from rows from (pg_catalog.unnest($2::text[]), pg_catalog.unnest($4::text[]),
                               pg_catalog.unnest($5::bool[]))
                    with ordinality as f(guard, after, lowered, n)),
              unseen as (
             select pg_catalog.string_agg(l.rel::pg_catalog.regclass::pg_catalog.text operator(pg_catalog.||) ': ' operator(pg_catalog.||) x.what, '; ') as members
               from bloom_guard.logged l
              cross join lateral (select coalesce(UNSEEN, DRIFT, ANCESTORS) as what) x
              where l.guard operator(pg_catalog.=) any ($2::text[]) and x.what is not null)
         select (greatest(u.lsn, f.after) operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                c.guard, c.kind::pg_catalog.text, LOWERED,
                (coalesce(u.below, '0/0') operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                u.epoch, f.n, (select members from unseen), u.lag
           from upto u
          cross join feeds f
           left join lateral (
                 select c.guard, c.kind, c.key, c.lsn from bloom_guard.log_changes c
                  where c.guard operator(pg_catalog.=) f.guard
                    and c.lsn operator(pg_catalog.>) f.after
                    and c.lsn operator(pg_catalog.<=) u.lsn) c on true
          order by f.n, c.lsn";

/// The slot's confirmed position, the server's insert position, and the
/// log's page size, in one statement.
async fn look(connection: &mut PgConnection, slot: &str) -> Result<(u64, u64, u64), LogReadError> {
    let row: (Option<i64>, i64, i32) = sqlx::query_as(
        "select (select (s.confirmed_flush_lsn operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8
                   from pg_catalog.pg_replication_slots s where s.slot_name = $1),
                (pg_catalog.pg_current_wal_insert_lsn() operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                pg_catalog.current_setting('wal_block_size')::pg_catalog.int4",
    )
    .bind(slot)
    .fetch_one(connection)
    .await?;
    let confirmed = row.0.ok_or_else(|| LogReadError::NoSlot(slot.to_owned()))?;
    Ok((
        confirmed.unsigned_abs(),
        row.1.unsigned_abs(),
        u64::try_from(row.2).unwrap_or(8192),
    ))
}

/// The furthest a record can end at or before `insert`: the server's
/// insert position just after a page's header is where the page's first
/// record would start, and no record ends inside a header, so a log whose
/// last record fills its page up to the end is decoded up to that end.
fn record_end_at_or_before(insert: u64, block: u64) -> u64 {
    // A page header is 24 bytes; the first page of a segment's, 40.
    match insert % block {
        24 | 40 => insert - insert % block,
        _ => insert,
    }
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
    fn an_insert_position_after_a_page_header_reaches_back_to_the_page() {
        assert_eq!(record_end_at_or_before(8192 * 3 + 24, 8192), 8192 * 3);
        assert_eq!(record_end_at_or_before(16 << 20 | 40, 8192), 16 << 20);
        assert_eq!(
            record_end_at_or_before(8192 * 3 + 200, 8192),
            8192 * 3 + 200
        );
        assert_eq!(lsn_text(0x1_0000_00A8), "1/A8");
    }
}
