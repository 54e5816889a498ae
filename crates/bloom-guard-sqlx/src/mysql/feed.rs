//! Reading the MySQL change feed without skipping a late commit, and
//! pruning it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, MySqlPool, Row as _};

use super::names::hex;
use super::position::{Cursor, OpenIds};
use super::settle::Settled;
use crate::digest::row_digest;
use crate::follow::changes::Changes;
use crate::follow::Read;
use crate::kept::KeptConnection;

/// Open ids asked for by value; more are read as a range and filtered.
const OPEN_BY_VALUE: u64 = 1000;

/// A feed row: id, guard, kind, key, time.
type Row = (i64, String, String, Option<Vec<u8>>, i64);

const COLUMNS: &str = "id, guard, kind, k, at";

/// The digest of a feed row, as a cursor keeps it.
fn digest_of((id, guard, kind, key, at): &Row) -> String {
    let key = key.as_deref().map(hex).unwrap_or_default();
    row_digest(&[&id.to_string(), guard, kind, &key, &at.to_string()])
}

/// The feed's position as `conn`'s snapshot sees it, ids up to `settled`
/// settled: the highest row, and the ids below it not visible yet.
pub(super) async fn position_in(
    conn: &mut MySqlConnection,
    settled: i64,
) -> Result<Cursor, sqlx::Error> {
    let below = horizon(&mut *conn).await?;
    let lower = settled.max(below - 1).max(0);
    let mut ids =
        sqlx::query_scalar::<_, i64>("select id from bloom_guard_changes where id > ? order by id")
            .bind(lower)
            .fetch(&mut *conn);
    let mut open = OpenIds::new();
    let mut high = lower;
    while let Some(id) = ids.try_next().await? {
        open.insert_run(high + 1, id - 1);
        high = id;
    }
    drop(ids);
    if high > lower {
        if let Some(row) = row_at(&mut *conn, high).await? {
            return Ok(Cursor {
                high,
                digest: Some(digest_of(&row)),
                open,
            });
        }
    }
    // Nothing visible above `lower`: the ids up to it are settled (those
    // not visible never commit) or below the horizon. The highest row at
    // or below it anchors the position, if pruning left one in reach.
    let anchor: Option<Row> = sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from bloom_guard_changes where id <= ? order by id desc limit 1"
    )))
    .bind(lower)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match anchor {
        Some(row) if row.0 + 1 >= below => Cursor {
            high: row.0,
            digest: Some(digest_of(&row)),
            open: OpenIds::new(),
        },
        // Pruned empty: the position holds while the horizon stays above.
        _ if below > 1 => Cursor {
            high: below - 1,
            digest: None,
            open: OpenIds::new(),
        },
        _ => Cursor::START,
    })
}

async fn row_at(conn: &mut MySqlConnection, id: i64) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(AssertSqlSafe(format!(
        "select {COLUMNS} from bloom_guard_changes where id = ?"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await
}

async fn horizon(conn: &mut MySqlConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("select cast(coalesce(max(below), 0) as signed) from bloom_guard_horizon")
        .fetch_one(conn)
        .await
}

/// The rows after `since` (the ids above its highest, and its open ones):
/// the condition on `{table}id` and its values.
fn after(since: &Cursor, table: &str) -> (String, Vec<i64>) {
    let open = &since.open;
    match open.first() {
        None => (format!("{table}id > ?"), vec![since.high]),
        Some(_) if open.len() <= OPEN_BY_VALUE => {
            let marks = vec!["?"; open.ids().count()].join(", ");
            let mut values = vec![since.high];
            values.extend(open.ids());
            (format!("({table}id > ? or {table}id in ({marks}))"), values)
        }
        // Many open ids (a long transaction held them): the range from the
        // first, filtered as it is read.
        Some(first) => (format!("{table}id >= ?"), vec![first]),
    }
}

/// The session a follower's kept connection reads in: `REPEATABLE READ`
/// whatever the server's or the pool's default (a read is one statement,
/// which reads one consistent view under it; under `READ UNCOMMITTED` it
/// would see rows that may yet roll back).
pub(super) const READ_SESSION: &str = "set session transaction isolation level repeatable read";

/// The connection a follower keeps for its feed reads.
pub(super) fn feed_connection(pool: &MySqlPool) -> KeptConnection<MySqlConnection> {
    let pool = pool.clone();
    KeptConnection::new(
        move || pool.connect_options().as_ref().clone(),
        Some(READ_SESSION),
    )
}

/// Reads the changes of feed `name` after `since`, in one statement on
/// the kept connection: the rows after the cursor (every feed's: the
/// cursor follows ids), the horizon and the row at the cursor, in one
/// consistent view. A read that failed closes the connection.
pub(super) async fn read_since(
    kept: &KeptConnection<MySqlConnection>,
    settled: &Arc<Settled>,
    pool: &MySqlPool,
    name: &str,
    collation: Option<&str>,
    since: &Cursor,
) -> Result<Read<Cursor>, sqlx::Error> {
    // Settled before the statement's view: an id up to it that this read
    // does not see never commits. A position with open ids moves the
    // method on.
    let causal = settled.known_galera();
    let settled = if since.open.is_empty() {
        settled.now()
    } else {
        settled.advance(pool)
    };
    let (condition, values) = after(since, "c.");
    // Under a collation, each of the feed's keys also as the server
    // weighs it (the name is the statement's first value).
    let weighed = collation.map_or_else(
        || "null".to_owned(),
        |collation| {
            format!(
                "case when c.guard = ? then {} end",
                super::collation::weighed("c.k", collation)
            )
        },
    );
    // On Galera the read first applies what any node committed before
    // it, for this statement only.
    let causal = if causal {
        "set statement wsrep_sync_wait = 1 for "
    } else {
        ""
    };
    let statement = format!(
        "{causal}select h.below, m.id, m.guard, m.kind, m.k, m.at, c.id, c.guard, c.kind, c.k, c.at, {weighed}
         from (select cast(coalesce(max(below), 0) as signed) as below from bloom_guard_horizon) h
         left join bloom_guard_changes m on m.id = ?
         left join bloom_guard_changes c on {condition}
         order by c.id"
    );
    let read = crate::kept::again_if_lost(|| async {
        let mut query = sqlx::query(AssertSqlSafe(statement.as_str()));
        if collation.is_some() {
            query = query.bind(name);
        }
        query = query.bind(since.high);
        for value in &values {
            query = query.bind(*value);
        }
        let mut lease = kept.lease().await?;
        let read =
            crate::kept::within_timeout(read_rows(query, lease.connection(), since, name)).await?;
        lease.keep();
        Ok(read)
    })
    .await?;
    let (first, changes, seen, last) = read;
    let (below, at_high) = first.ok_or(sqlx::Error::RowNotFound)?;
    // Pruning moves the horizon before it deletes: rows this reader still
    // needs may be gone once it passed them.
    if since.high + 1 < below || since.open.first().is_some_and(|first| first < below) {
        return Ok(Read::Pruned);
    }
    // The row at the position must still be the one it was taken at, or
    // gone by pruning: otherwise the feed was rewritten under the reader.
    if since.high > 0 {
        match at_high {
            Some(row) if Some(digest_of(&row)) == since.digest => {}
            None if since.high < below => {}
            _ => return Ok(Read::Pruned),
        }
    }
    let mut reached = since.clone();
    if let Some(row) = last.filter(|row| row.0 > since.high) {
        reached.open.insert_run(since.high + 1, row.0 - 1);
        reached.high = row.0;
        reached.digest = Some(digest_of(&row));
    }
    reached.open.remove_up_to(settled);
    for id in seen {
        reached.open.remove(id);
    }
    Ok(Read::Changes {
        position: reached,
        changes,
    })
}

/// What one read statement brought: the horizon and the row at the
/// cursor, the changes of feed `name`, the ids seen, the last row.
type ReadRows = (
    Option<(i64, Option<Row>)>,
    Changes,
    BTreeSet<i64>,
    Option<Row>,
);

/// Runs the read statement and gathers its rows.
async fn read_rows(
    query: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    connection: &mut MySqlConnection,
    since: &Cursor,
    name: &str,
) -> Result<ReadRows, sqlx::Error> {
    let mut rows = query.fetch(connection);
    let mut changes = Changes::default();
    let mut seen = BTreeSet::new();
    let mut last: Option<Row> = None;
    let mut first = None;
    while let Some(raw) = rows.try_next().await? {
        if first.is_none() {
            let below: i64 = raw.try_get(0)?;
            first = Some((below, row_from(&raw, 1)?));
        }
        let Some(row) = row_from(&raw, 6)? else {
            continue; // the one row of a read that found nothing
        };
        let id = row.0;
        if id <= since.high && !since.open.contains(id) {
            continue;
        }
        seen.insert(id);
        if row.1 == name {
            match raw.try_get::<Option<Vec<u8>>, _>(11)? {
                Some(weighed) => changes.record_weighed(&row.2, Some(&weighed)),
                None => changes.record(&row.2, row.3.as_deref()),
            }
        }
        last = Some(row);
    }
    Ok((first, changes, seen, last))
}

/// The feed row in the five columns from `from`, if it is not null.
fn row_from(row: &MySqlRow, from: usize) -> Result<Option<Row>, sqlx::Error> {
    let Some(id) = row.try_get::<Option<i64>, _>(from)? else {
        return Ok(None);
    };
    Ok(Some((
        id,
        row.try_get(from + 1)?,
        row.try_get(from + 2)?,
        row.try_get(from + 3)?,
        row.try_get(from + 4)?,
    )))
}

/// Counts the rows of feed `name` after `since`, up to `limit`.
pub(super) async fn pending(
    pool: &MySqlPool,
    name: &str,
    since: &Cursor,
    limit: u64,
) -> Result<u64, sqlx::Error> {
    let (condition, values) = after(since, "");
    let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
        "select cast(count(*) as signed) from (
            select 1 from bloom_guard_changes where guard = ? and {condition} limit ?) as pending"
    )))
    .bind(name);
    for value in values {
        query = query.bind(value);
    }
    let count = query
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await?;
    Ok(count.max(0) as u64)
}

/// Rows deleted by one statement of a prune: short locks.
const PRUNE_BATCH: i64 = 5000;

/// Moves the horizon past the rows older than the retention, never past
/// `settled` (an id above it may still commit), then deletes them; how
/// many. One instance at a time: the others find the lock taken.
pub(super) async fn prune(
    pool: &MySqlPool,
    settled: i64,
    retention: Duration,
) -> Result<i64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let locked: Option<i64> = sqlx::query_scalar(
        "select get_lock(concat('bloom_guard.prune.', left(sha2(database(), 256), 40)), 0)",
    )
    .fetch_one(&mut *conn)
    .await?;
    if locked != Some(1) {
        return Ok(0);
    }
    let pruned = prune_locked(&mut conn, settled, retention).await;
    let released = sqlx::query(
        "select release_lock(concat('bloom_guard.prune.', left(sha2(database(), 256), 40)))",
    )
    .execute(&mut *conn)
    .await;
    if released.is_err() {
        // The lock goes with the session.
        drop(conn.detach());
    }
    pruned
}

async fn prune_locked(
    conn: &mut MySqlConnection,
    settled: i64,
    retention: Duration,
) -> Result<i64, sqlx::Error> {
    // A plain read: no locks in the writers' way.
    let old: Option<i64> = sqlx::query_scalar(
        "select cast(max(id) as signed) from bloom_guard_changes where at < unix_timestamp() - ?",
    )
    .bind(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX))
    .fetch_one(&mut *conn)
    .await?;
    let Some(old) = old else {
        return Ok(0);
    };
    sqlx::query("update bloom_guard_horizon set below = greatest(below, ?)")
        .bind((old + 1).min(settled + 1))
        .execute(&mut *conn)
        .await?;
    let below = horizon(&mut *conn).await?;
    let mut deleted = 0;
    loop {
        // Row locks only, no gap locks: writers append meanwhile.
        let mut tx = conn
            .begin_with("set transaction isolation level read committed; start transaction")
            .await?;
        let batch = sqlx::query("delete from bloom_guard_changes where id < ? order by id limit ?")
            .bind(below)
            .bind(PRUNE_BATCH)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        deleted += i64::try_from(batch).unwrap_or(i64::MAX);
        if batch < PRUNE_BATCH.unsigned_abs() {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests;
