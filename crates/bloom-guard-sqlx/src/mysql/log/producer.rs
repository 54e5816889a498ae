//! The binary log feed's producer: streams the server's binary log and
//! writes each committed transaction's feed rows to
//! `bloom_guard_log_changes`, with the transaction's end point, in commit
//! order, once.
//!
//! Why points in the log and not the triggers' row ids: the rows are
//! written in the producer's transaction, which commits after the change
//! it records. A scan whose snapshot sees the change but not the
//! producer's rows, replayed from the rows after it, would apply the change
//! twice: a delete twice removes another key's fingerprint. By end point,
//! a scan at a point (`scan.rs`) holds every change up to it and none
//! after.
//!
//! The producers of a fleet elect one per database (`GET_LOCK` on the
//! connection it writes with: a producer whose lock is gone can write
//! nothing more). It
//! resumes from its progress, which it writes in the transaction of the
//! rows it covers, so no transaction is written twice or skipped. A log
//! it cannot resume (another server's after a failover, a file purged
//! before it was read) starts a new epoch of the feed: every follower
//! rebuilds, none reads past what it missed.

use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use mysql_async::prelude::Queryable as _;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};
use tokio_util::sync::CancellationToken;

use super::error::BinlogError;
use super::feed::at_point_lock;
use super::position::{log_end, BinlogPoint, SERVER};
use super::registry::logged_tables;
use super::stream::{Committed, Transactions};
use crate::per_database::{Membership, PerDatabase};

/// The pause before a producer that failed starts again.
const RETRY: Duration = Duration::from_secs(1);

/// How long the election's statement waits for the lock at a time.
const ELECTION: i64 = 2;

/// The least time between two writes of progress alone (commits of other
/// tables): a barrier's read that cannot wait for it looks at the log
/// itself (`feed.rs`).
const PROGRESS_EVERY: Duration = Duration::from_millis(5);

/// The server's heartbeat period on the stream, and how long without an
/// event the stream counts as lost.
const HEARTBEAT: Duration = Duration::from_secs(1);
const SILENT: Duration = Duration::from_secs(5);

/// A write's most events, most feed rows, and longest time taking them,
/// before it is written: a batch never holds the progress back for long.
const BATCH_EVENTS: usize = 4_096;
const BATCH_ROWS: usize = 20_000;
const BATCH_TIME: Duration = Duration::from_millis(2);

/// Feed rows per `INSERT`.
const INSERT_ROWS: usize = 500;

static PRODUCERS: PerDatabase<()> = PerDatabase::new();

/// The process's producer for `database`, for as long as a membership is
/// held; it streams with `url`.
pub(crate) fn join(database: String, pool: MySqlPool, url: String) -> Membership<()> {
    PRODUCERS.join(database, (), move |stop| {
        tokio::spawn(Producer { pool, url }.run(stop))
    })
}

struct Producer {
    pool: MySqlPool,
    url: String,
}

impl Producer {
    async fn run(self, stop: CancellationToken) {
        let mut warned: Option<String> = None;
        while !stop.is_cancelled() {
            match self.elected(&stop).await {
                Ok(()) => warned = None,
                Err(error) => {
                    let message = crate::error::error_chain(&error);
                    if warned.as_deref() != Some(message.as_str()) {
                        tracing::warn!(
                            error = message,
                            "the binary log feed's producer stopped; starting again"
                        );
                        warned = Some(message);
                    } else {
                        tracing::debug!(
                            error = message,
                            "the binary log feed's producer stopped again"
                        );
                    }
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// Waits to be elected, then produces until stopped or failed.
    async fn elected(&self, stop: &CancellationToken) -> Result<(), BinlogError> {
        let mut connection = MySqlConnection::connect_with(&self.pool.connect_options()).await?;
        loop {
            let taken: Option<i64> = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                taken = sqlx::query_scalar("select get_lock(concat('bloom_guard_binlog:', md5(database())), ?)")
                    .bind(ELECTION)
                    .fetch_one(&mut connection) => taken?,
            };
            if taken == Some(1) {
                break;
            }
        }
        let produced = self.produce(&mut connection, stop).await;
        // The lock goes with the connection.
        let _ = connection.close().await;
        produced
    }

    async fn produce(
        &self,
        connection: &mut MySqlConnection,
        stop: &CancellationToken,
    ) -> Result<(), BinlogError> {
        let server: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {SERVER}")))
            .fetch_one(&mut *connection)
            .await?;
        let stored: Option<(String, String, String, i64)> = sqlx::query_as(
            "select server, epoch, file, pos from bloom_guard_log_progress where id = 1",
        )
        .fetch_optional(&mut *connection)
        .await?;
        let (mut epoch, mut start) = match stored {
            Some((stored_server, epoch, file, pos)) if stored_server == server => (
                epoch,
                BinlogPoint {
                    file,
                    pos: pos.try_into().unwrap_or(4),
                },
            ),
            stored => {
                if stored.is_some() {
                    tracing::warn!("the binary log is another server's than the feed's progress (a failover, a restore): the feed starts over, every guard rebuilds");
                }
                start_over(connection, &server).await?
            }
        };
        loop {
            match self.stream(connection, &server, &epoch, start, stop).await {
                Err(BinlogError::Stream(mysql_async::Error::Server(error)))
                    if error.code == 1236 =>
                {
                    // The log to resume from is gone (purged, or another
                    // server's): what it held is in no feed.
                    tracing::warn!(error = %error.message, "the binary log to resume from cannot be read: the feed starts over, every guard rebuilds");
                    (epoch, start) = start_over(connection, &server).await?;
                }
                other => return other,
            }
        }
    }

    /// Streams the log from `start` and writes its transactions.
    async fn stream(
        &self,
        connection: &mut MySqlConnection,
        server: &str,
        epoch: &str,
        start: BinlogPoint,
        stop: &CancellationToken,
    ) -> Result<(), BinlogError> {
        let tables = logged_tables(connection).await?;
        let mut binlog = open(&self.url, &start).await?;
        let mut transactions = Transactions::new(start.clone(), tables);
        let mut marked: Option<BinlogPoint> = None;
        let mut writer = Writer {
            server: server.to_owned(),
            epoch: epoch.to_owned(),
            written: start,
            unwritten: None,
            last_write: tokio::time::Instant::now(),
        };
        loop {
            let due = writer
                .unwritten
                .as_ref()
                .map(|_| writer.last_write + PROGRESS_EVERY);
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = sleep_until(due) => {
                    writer.write(connection, Vec::new()).await?;
                    continue;
                }
                event = tokio::time::timeout(SILENT, binlog.next()) => event,
            };
            let event = match event {
                Err(_) => {
                    return Err(BinlogError::Url(
                        "the binary log stream fell silent".to_owned(),
                    ))
                }
                Ok(None) => {
                    return Err(BinlogError::Url(
                        "the server ended the binary log stream".to_owned(),
                    ))
                }
                Ok(Some(event)) => event?,
            };
            let mut batch = Vec::new();
            batch.extend(transactions.event(&event, &binlog)?);
            let (mut events, mut rows) = (
                1,
                batch
                    .iter()
                    .map(|c: &Committed| c.rows.len())
                    .sum::<usize>(),
            );
            // What the stream holds already goes in the same write.
            let mut caught_up = false;
            let taking = tokio::time::Instant::now();
            while events < BATCH_EVENTS && rows < BATCH_ROWS && taking.elapsed() < BATCH_TIME {
                let Some(Some(event)) = binlog.next().now_or_never() else {
                    caught_up = true;
                    break;
                };
                let event = event?;
                if let Some(committed) = transactions.event(&event, &binlog)? {
                    rows += committed.rows.len();
                    batch.push(committed);
                }
                events += 1;
            }
            let reload = batch
                .iter()
                .any(|committed| committed.tables_changed || !committed.resync.is_empty());
            writer.take(connection, batch).await?;
            if writer.due() {
                writer.write(connection, Vec::new()).await?;
            }
            if reload {
                transactions.set_tables(logged_tables(connection).await?);
            }
            if caught_up && marked.as_ref() != Some(transactions.boundary()) {
                mark(connection, transactions.boundary(), marked.as_ref()).await?;
                marked = Some(transactions.boundary().clone());
            }
        }
    }
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// A feed row as written: the feed, the kind, the key (none for a
/// resync), and the end point of its transaction (file sequence, offset).
type Row = (String, char, Option<Vec<u8>>, u64, u64);

/// What the producer has written, and what it owes.
struct Writer {
    server: String,
    epoch: String,
    /// The progress written last.
    written: BinlogPoint,
    /// A point past `written` that only commits of other tables reached:
    /// written within [`PROGRESS_EVERY`].
    unwritten: Option<BinlogPoint>,
    last_write: tokio::time::Instant,
}

impl Writer {
    /// Whether progress past commits of other tables waits longer than
    /// [`PROGRESS_EVERY`].
    fn due(&self) -> bool {
        self.unwritten.is_some() && self.last_write.elapsed() >= PROGRESS_EVERY
    }

    /// Takes a batch of committed transactions: writes their rows at once,
    /// the progress past commits of other tables soon, and nothing for
    /// commits of the feed's own tables (its own progress among them).
    async fn take(
        &mut self,
        connection: &mut MySqlConnection,
        batch: Vec<Committed>,
    ) -> Result<(), BinlogError> {
        let mut rows = Vec::new();
        let mut now = false;
        for committed in batch {
            let Some(end) = committed.end else { continue };
            let seq = end.sequence().unwrap_or(0);
            now |= !committed.rows.is_empty()
                || !committed.resync.is_empty()
                || committed.tables_changed;
            for (feed, kind, key) in committed.rows {
                rows.push((feed, kind, Some(key), seq, end.pos));
            }
            for feed in committed.resync {
                rows.push((feed, 'r', None, seq, end.pos));
            }
            let new_file = end.file != self.written.file;
            if committed.foreign || new_file {
                self.unwritten = Some(end);
            } else if self.unwritten.is_some() {
                // Past a commit of another table: the progress goes as far.
                self.unwritten = Some(end);
            }
        }
        if now {
            self.write(connection, rows).await
        } else {
            Ok(())
        }
    }

    /// Writes `rows` and the progress up to the last point taken, in one
    /// transaction.
    async fn write(
        &mut self,
        connection: &mut MySqlConnection,
        rows: Vec<Row>,
    ) -> Result<(), BinlogError> {
        let Some(point) = self.unwritten.take() else {
            return Ok(());
        };
        let mut tx = connection.begin().await?;
        for chunk in rows.chunks(INSERT_ROWS) {
            let values = vec!["(?, ?, ?, unix_timestamp(), ?, ?)"; chunk.len()].join(", ");
            let statement = format!(
                "insert into bloom_guard_log_changes (guard, kind, k, at, seq, pos) values {values}"
            );
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(statement));
            for (feed, kind, key, seq, pos) in chunk {
                insert = insert
                    .bind(feed)
                    .bind(kind.to_string())
                    .bind(key.as_deref().unwrap_or_default())
                    .bind(seq)
                    .bind(pos);
            }
            insert.execute(&mut *tx).await?;
        }
        let updated = sqlx::query(
            "update bloom_guard_log_progress
                set file = ?, seq = ?, pos = ?, at = cast(unix_timestamp(now(6)) * 1000000 as signed)
              where id = 1 and epoch = ? and server = ?",
        )
        .bind(&point.file)
        .bind(point.sequence().unwrap_or(0))
        .bind(point.pos)
        .bind(&self.epoch)
        .bind(&self.server)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if updated != 1 {
            return Err(BinlogError::Url(
                "the feed's progress changed under its producer".to_owned(),
            ));
        }
        tx.commit().await?;
        self.written = point;
        self.last_write = tokio::time::Instant::now();
        Ok(())
    }
}

/// Holds the user lock named for `point` (and no longer the one for
/// `before`): every commit up to it is handled, and the stream held
/// nothing more (`feed.rs`).
async fn mark(
    connection: &mut MySqlConnection,
    point: &BinlogPoint,
    before: Option<&BinlogPoint>,
) -> Result<(), sqlx::Error> {
    let name = |point: &BinlogPoint| at_point_lock(point.sequence().unwrap_or(0), point.pos);
    let release = before.map_or_else(
        || "null".to_owned(),
        |before| format!("release_lock({})", name(before)),
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "select get_lock({}, 0), {release}",
        name(point)
    )))
    .execute(connection)
    .await?;
    Ok(())
}

/// Starts a new epoch of the feed at the log's end: the rows of the old
/// one go, and every follower, at a position of the old epoch, rebuilds.
async fn start_over(
    connection: &mut MySqlConnection,
    server: &str,
) -> Result<(String, BinlogPoint), BinlogError> {
    let epoch = format!("{:016x}", fastrand::u64(..));
    let mut tx = connection.begin().await?;
    let end = log_end(&mut tx).await?;
    let seq = end.sequence().unwrap_or(0);
    sqlx::query("delete from bloom_guard_log_changes")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "insert into bloom_guard_log_progress (id, server, epoch, file, seq, pos, below_seq, below_pos, at)
         values (1, ?, ?, ?, ?, ?, ?, ?, cast(unix_timestamp(now(6)) * 1000000 as signed))
         on duplicate key update server = values(server), epoch = values(epoch), file = values(file),
                                 seq = values(seq), pos = values(pos), below_seq = values(below_seq),
                                 below_pos = values(below_pos), at = values(at)",
    )
    .bind(server)
    .bind(&epoch)
    .bind(&end.file)
    .bind(seq)
    .bind(end.pos)
    .bind(seq)
    .bind(end.pos)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((epoch, end))
}

/// The binary log from `start`, over a replication connection of its own.
async fn open(url: &str, start: &BinlogPoint) -> Result<mysql_async::BinlogStream, BinlogError> {
    let options = super::url::options(url)?;
    let mut connection = mysql_async::Conn::new(options).await?;
    let period = u64::try_from(HEARTBEAT.as_nanos()).unwrap_or(u64::MAX);
    connection
        .query_drop(format!("set @master_heartbeat_period = {period}"))
        .await?;
    // A replica's id of its own: a second stream with one id ends the first.
    let replica_id = fastrand::u32(1 << 24..1 << 31);
    let request = mysql_async::BinlogStreamRequest::new(replica_id)
        .with_filename(start.file.as_bytes())
        .with_pos(start.pos);
    Ok(connection.get_binlog_stream(request).await?)
}
