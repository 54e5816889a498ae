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
use super::position::{BinlogPoint, SERVER};
use super::registry::logged_tables;
use super::stream::{Committed, Transactions};
use super::write::{mark, start_over, Writer, PROGRESS_EVERY};
use crate::per_database::{Membership, PerDatabase};

/// The pause before a producer that failed starts again.
const RETRY: Duration = Duration::from_secs(1);

/// How long the election's statement waits for the lock at a time.
const ELECTION: i64 = 2;

/// The server's heartbeat period on the stream, and how long without an
/// event the stream counts as lost.
const HEARTBEAT: Duration = Duration::from_secs(1);
const SILENT: Duration = Duration::from_secs(5);

/// How long the stream stays quiet before the point a batch cut short
/// reached is marked.
const MARK_AFTER: Duration = Duration::from_millis(1);

/// A write's most events, most feed rows, and longest time taking them,
/// before it is written: a batch never holds the progress back for long.
const BATCH_EVENTS: usize = 4_096;
const BATCH_ROWS: usize = 20_000;
const BATCH_TIME: Duration = Duration::from_millis(2);

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
            let unmarked = marked.as_ref() != Some(transactions.boundary());
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = sleep_until(due) => {
                    writer.write(connection, Vec::new()).await?;
                    continue;
                }
                // A batch cut short by its bounds left the point it reached
                // unmarked: marked once the stream is quiet a moment, or a
                // refusal would wait for the next commit anywhere.
                () = tokio::time::sleep(MARK_AFTER), if unmarked => {
                    mark(connection, transactions.boundary(), marked.as_ref()).await?;
                    marked = Some(transactions.boundary().clone());
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
                // Unconstrained by the runtime's cooperative budget: spent
                // (after 128 reads in one poll), it makes a stream with
                // events waiting look empty, and every write would take
                // some 25 transactions however many wait.
                let Some(Some(event)) = tokio::task::unconstrained(binlog.next()).now_or_never()
                else {
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

/// The binary log from `start`, over a replication connection of its own
/// (over TLS first where the URL prefers it, then without).
async fn open(url: &str, start: &BinlogPoint) -> Result<mysql_async::BinlogStream, BinlogError> {
    #[cfg(feature = "binlog-feed-tls")]
    {
        // mysql_async takes the process's default TLS provider; one where
        // the application installed none.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut failed = None;
    let mut connection = None;
    for options in super::url::options(url)?.attempts() {
        match mysql_async::Conn::new(options).await {
            Ok(opened) => {
                connection = Some(opened);
                break;
            }
            Err(error) => failed = Some(error),
        }
    }
    let mut connection = match (connection, failed) {
        (Some(connection), _) => connection,
        (None, Some(error)) => return Err(error.into()),
        (None, None) => return Err(BinlogError::Url("no way to connect".to_owned())),
    };
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
