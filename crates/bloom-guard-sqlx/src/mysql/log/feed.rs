//! Reading the binary log feed: the rows after a position, and the read
//! barrier by log position.
//!
//! A position is a point in the log of one epoch of the feed: every change
//! committed up to it is in the rows at or before it, none after (the
//! producer writes each transaction's rows with its end point, in commit
//! order, with its progress). A read's new position is the progress its
//! statement sees.
//!
//! The barrier: a commit visible before a request arrived ends at or
//! before the server's log end taken after it arrived (`SHOW MASTER
//! STATUS`). A read for the barrier reads once the producer has handled
//! every commit up to that end: its progress reaches it (written with each
//! transaction's rows, and within 5 ms of commits of other tables), or it
//! holds the user lock named for exactly that point, which it takes
//! whenever it has caught up with the stream (or it has been quiet for a
//! millisecond). The lock is not logged, so
//! an idle server's end stays where the producer caught up: a refusal
//! there waits for one look, not for a write that would move the end
//! again. (`SHOW BINLOG EVENTS` could tell what lies between, but it locks
//! the active log against writers while it reads.)

use std::time::Duration;

use futures_util::TryStreamExt as _;
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool, Row as _};

use super::error::BinlogError;
use super::position::{log_end, ordinal, BinlogPoint, LogPosition, SERVER};
use crate::follow::changes::Changes;
use crate::follow::Read;

/// How often a barrier's read looks again while the producer is behind.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// The producer's progress as a read sees it.
#[derive(Debug)]
struct Progress {
    epoch: String,
    point: BinlogPoint,
    seq: u64,
    below: (u64, u64),
}

async fn progress(connection: &mut MySqlConnection) -> Result<Option<Progress>, sqlx::Error> {
    let row = sqlx::query(
        "select epoch, file, seq, pos, below_seq, below_pos
           from bloom_guard_log_progress where id = 1",
    )
    .fetch_optional(connection)
    .await?;
    row.map(|row| {
        Ok(Progress {
            epoch: row.try_get(0)?,
            point: BinlogPoint {
                file: row.try_get(1)?,
                pos: row.try_get::<i64, _>(3)?.try_into().unwrap_or(0),
            },
            seq: row.try_get::<i64, _>(2)?.try_into().unwrap_or(0),
            below: (
                row.try_get::<i64, _>(4)?.try_into().unwrap_or(0),
                row.try_get::<i64, _>(5)?.try_into().unwrap_or(0),
            ),
        })
    })
    .transpose()
}

/// The name of the user lock the producer holds while it has handled
/// every commit up to a point of the log and the stream holds nothing
/// more: the point (file sequence, offset) bound to its two parameters.
/// `GET_LOCK` is not logged, so holding it moves nothing.
///
/// Every statement naming it has one text whatever the point: a text per
/// point would be a prepared statement per point, and the connection's
/// cache of them would churn (`write.rs` says what that costs).
pub(super) const AT_POINT_LOCK: &str =
    "concat('bloom_guard_binlog_at:', left(md5(database()), 16), ':', ?, ':', ?)";

/// [`AT_POINT_LOCK`] of the database named by a first parameter: the
/// producer's, which writes the feeds of several databases.
pub(super) const AT_POINT_LOCK_OF: &str =
    "concat('bloom_guard_binlog_at:', left(md5(?), 16), ':', ?, ':', ?)";

/// Waits until the producer has written every change committed before
/// the call, at most until `deadline`.
pub(super) async fn wait_for_producer(
    connection: &mut MySqlConnection,
    deadline: tokio::time::Instant,
) -> Result<(), BinlogError> {
    let target = log_end(connection).await?;
    let statement = format!(
        "select server = {SERVER}, file, pos, is_used_lock({AT_POINT_LOCK}) is not null
           from bloom_guard_log_progress where id = 1"
    );
    loop {
        let look: Option<(i64, String, i64, i64)> =
            sqlx::query_as(AssertSqlSafe(statement.as_str()))
                .bind(target.sequence().unwrap_or(0))
                .bind(target.pos)
                .fetch_optional(&mut *connection)
                .await?;
        if let Some((same_server, file, pos, at_target)) = look.clone() {
            let progress = BinlogPoint {
                file,
                pos: pos.try_into().unwrap_or(0),
            };
            // A point of another server's log (a failover the producer
            // has not seen yet) says nothing of this one's; the lock is
            // this server's.
            if at_target == 1 || (same_server == 1 && progress.reaches(&target)) {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let seen = look.map_or_else(
                || "no progress".to_owned(),
                |(_, file, pos, _)| format!("progress {file}:{pos}"),
            );
            return Err(BinlogError::Behind(format!("{target} ({seen})")));
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The rows of feed `guard` after `since`, and the position they reach;
/// under a collation, each key also as the server weighs it.
pub(super) async fn read_since(
    connection: &mut MySqlConnection,
    guard: &str,
    collation: Option<&str>,
    since: &LogPosition,
) -> Result<Read<LogPosition>, sqlx::Error> {
    let Some(progress) = progress(&mut *connection).await? else {
        // The producer has written nothing yet: nothing to read.
        return Ok(Read::Changes {
            position: since.clone(),
            changes: Changes::default(),
        });
    };
    if progress.epoch != since.epoch || (since.seq, since.pos) < progress.below {
        return Ok(Read::Pruned);
    }
    let weighed = collation.map_or_else(
        || "null".to_owned(),
        |collation| super::super::collation::weighed("k", collation),
    );
    let statement = format!(
        "select kind, k, {weighed} from bloom_guard_log_changes
          where guard = ? and point > ? and point <= ?
          order by id"
    );
    let mut rows = sqlx::query(AssertSqlSafe(statement))
        .bind(guard)
        .bind(ordinal(since.seq, since.pos))
        .bind(ordinal(progress.seq, progress.point.pos))
        .fetch(&mut *connection);
    let mut changes = Changes::default();
    while let Some(row) = rows.try_next().await? {
        let kind: String = row.try_get(0)?;
        match row.try_get::<Option<Vec<u8>>, _>(2)? {
            Some(weighed) => changes.record_weighed(&kind, Some(&weighed)),
            None => changes.record(&kind, row.try_get::<Option<Vec<u8>>, _>(1)?.as_deref()),
        }
    }
    let reached = LogPosition {
        epoch: progress.epoch,
        seq: progress.seq,
        pos: progress.point.pos,
    };
    Ok(Read::Changes {
        position: since.clone().max(reached),
        changes,
    })
}

/// The feed's position now: the producer's progress.
pub(super) async fn position_now(
    connection: &mut MySqlConnection,
) -> Result<Option<LogPosition>, sqlx::Error> {
    Ok(progress(connection).await?.map(|progress| LogPosition {
        epoch: progress.epoch,
        seq: progress.seq,
        pos: progress.point.pos,
    }))
}

/// Counts the rows of feed `guard` after `since`, up to `limit`.
pub(super) async fn pending(
    pool: &MySqlPool,
    guard: &str,
    since: &LogPosition,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let count: i64 = sqlx::query_scalar(
        "select cast(count(*) as signed) from (
            select 1 from bloom_guard_log_changes where guard = ? and point > ? limit ?) as pending",
    )
    .bind(guard)
    .bind(ordinal(since.seq, since.pos))
    .bind(limit)
    .fetch_one(pool)
    .await?;
    Ok(count.try_into().unwrap_or(0))
}

/// Removes the rows older than `retention`, moving the horizon first:
/// a reader behind it reads `Pruned` and rebuilds.
pub(super) async fn prune(pool: &MySqlPool, retention: Duration) -> Result<i64, sqlx::Error> {
    let seconds = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let mut tx = pool.begin().await?;
    let last: Option<(i64, i64)> = sqlx::query_as(
        "select seq, pos from bloom_guard_log_changes
          where at < unix_timestamp() - ? order by id desc limit 1",
    )
    .bind(seconds)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((seq, pos)) = last else {
        tx.commit().await?;
        return Ok(0);
    };
    sqlx::query(
        "update bloom_guard_log_progress set below_seq = ?, below_pos = ?
          where id = 1 and (below_seq, below_pos) < (?, ?)",
    )
    .bind(seq)
    .bind(pos)
    .bind(seq)
    .bind(pos)
    .execute(&mut *tx)
    .await?;
    let gone = sqlx::query("delete from bloom_guard_log_changes where point <= ?")
        .bind(ordinal(
            seq.try_into().unwrap_or(0),
            pos.try_into().unwrap_or(0),
        ))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(gone.try_into().unwrap_or(i64::MAX))
}
