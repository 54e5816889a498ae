//! The log feed's producer: streams the database's slot and writes each
//! committed transaction's feed rows to `bloom_guard.log_changes`, at the
//! end of that transaction's commit, in commit order, once.
//!
//! Why positions in the log and not the triggers' snapshots: the rows are
//! written in the producer's transaction, which commits after the change
//! it records. A scan whose snapshot sees the change but not the
//! producer's rows, replayed from the triggers' position (transactions
//! committed after the snapshot), would apply the change twice: a delete
//! twice removes another key's fingerprint. By commit end, a scan at a
//! position (an exported snapshot of the slot's, `scan_point`) holds every
//! change up to it and none after.
//!
//! The slot takes one reader at a time, so the producers of a fleet elect
//! one ([`Lease`]): it streams and writes, the others wait in the
//! election's queue, and the next one takes over when it stops.
//!
//! A transaction's rows and the slot's progress (its commit's end) go in
//! one transaction; the server hears of the progress only after that
//! commits. A transaction the slot sends again (after a crash, or a
//! connection killed before the server heard) ends at or before the
//! progress and is skipped: no change is written twice.

use std::time::Duration;

use futures_util::FutureExt as _;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::error::ProducerError;
use super::install::slot_name;
use super::lease::Lease;
use super::publication::logged_tables;
use super::rows::Batch;
use super::stream::{Event, LogStream, LoggedTable, StreamError};
use super::url::Server;
use crate::per_database::{Membership, PerDatabase};

/// The pause before a producer tries the slot again after a failure.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// The longest pause between an elected producer's tries of a slot
/// another reader still streams (one whose election ended, its stream
/// not yet: a killed instance's, until the server notices).
const BUSY: Duration = Duration::from_secs(5);

/// One producer per database in this process, whatever the number of
/// guards on the log feed.
static PRODUCERS: PerDatabase<()> = PerDatabase::new();

/// Joins the process's producer for `database`: the first follower of it
/// starts one, the last membership dropped stops it. Until a producer can
/// be made (the replication connection refused, the server down), it tries
/// again every [`RETRY`], warning once.
pub(crate) fn join(database: String, pool: PgPool, url: String) -> Membership<()> {
    PRODUCERS.join(database, (), move |stop| {
        tokio::spawn(async move {
                    let mut warned = false;
                    loop {
                        match Producer::new(pool.clone(), &url).await {
                            Ok(producer) => return producer.run(stop).await,
                            Err(error) if !warned => {
                                tracing::warn!(%error, "cannot start the log feed's producer; trying again");
                                warned = true;
                            }
                            Err(_) => {}
                        }
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(RETRY) => {}
                        }
                    }
                })
    })
}

/// A database's log feed producer.
pub(crate) struct Producer {
    pub(crate) pool: PgPool,
    /// The database's URL, for the replication connection.
    pub(crate) url: String,
    /// The pool's database, which the replication connection must reach
    /// (if known).
    pub(crate) server: Option<Server>,
    pub(crate) slot: String,
    pub(crate) publication: String,
}

impl Producer {
    /// Produces until `stop`, whenever this instance is elected.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut passed_over = Vec::new();
        // The last failure logged as a warning: each other one once.
        let mut warned: Option<String> = None;
        while !stop.is_cancelled() {
            // The server the pool reaches now (a URL of several servers).
            let url = crate::postgres::servers::narrowed(&self.url, &self.pool);
            let lease = tokio::select! {
                () = stop.cancelled() => return,
                lease = Lease::take(&url) => lease,
            };
            match lease {
                Ok(lease) => {
                    let stopped = self.term(&stop, &mut passed_over, &mut warned).await;
                    lease.release().await;
                    if stopped {
                        return;
                    }
                }
                Err(error) => warn_once(&mut warned, &error),
            }
            // A failure: the next standby, if any, tries meanwhile.
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// An elected producer's term: streams until `stop` (true) or a
    /// failure another instance may not share (false).
    async fn term(
        &self,
        stop: &CancellationToken,
        passed_over: &mut Vec<(String, String)>,
        warned: &mut Option<String>,
    ) -> bool {
        let mut busy = RETRY;
        loop {
            match self.produce(stop, passed_over).await {
                Ok(()) => return true,
                // A table put on the feed since the stream started comes
                // in the next one at once; one published for another
                // reason is passed over from then on.
                Err(ProducerError::Stream(StreamError::Unwatched(schema, table))) => {
                    tracing::debug!(%schema, %table, "a published table the stream was not told of; starting again");
                    passed_over.push((schema, table));
                }
                // Another reader still streams the slot (object in use,
                // whatever the server's language): tried again, the
                // pauses growing to `BUSY`, the election kept.
                Err(error) if crate::error::error_chain(&error).contains("SQLSTATE 55006") => {
                    tracing::debug!(error = %crate::error::error_chain(&error), "another reader still streams the log feed's slot");
                    tokio::select! {
                        () = stop.cancelled() => return true,
                        () = tokio::time::sleep(busy) => {}
                    }
                    busy = (busy * 2).min(BUSY);
                }
                Err(error) => {
                    warn_once(warned, &error);
                    return stop.is_cancelled();
                }
            }
        }
    }

    /// One stream of the slot, from the feed's progress, until `stop` or
    /// an error; the published tables `passed_over` that are not on the
    /// log feed are passed over.
    pub(crate) async fn produce(
        &self,
        stop: &CancellationToken,
        passed_over: &[(String, String)],
    ) -> Result<(), ProducerError> {
        // A slot missing or lost is made again, and the feed starts over
        // at its start: the guards on it rebuild.
        super::slot::ensure(&self.pool, &self.slot).await?;
        let epoch = super::slot::epoch(&self.pool).await?;
        let after = self.progress().await?;
        let tables = self.tables(passed_over).await?;
        let mut stream = LogStream::start(
            &crate::postgres::servers::narrowed(&self.url, &self.pool),
            self.server.as_ref(),
            &self.slot,
            &self.publication,
            &tables,
            after,
        )
        .await?;
        tracing::info!(slot = %self.slot, "streaming the log feed's slot");
        // The transactions received and not written yet: written together
        // once no more is at hand, or the batch is full.
        let mut batch = Batch::default();
        loop {
            let event = if batch.is_empty() {
                tokio::select! {
                    () = stop.cancelled() => {
                        stream.stop().await;
                        return Ok(());
                    }
                    event = stream.next() => event?,
                }
            } else {
                // Receiving is cancel-safe: a transaction half received
                // stays in the stream. Unconstrained by the runtime's
                // cooperative budget: spent (after 128 receives), it makes
                // a ready channel look empty, and every write would take
                // some 40 transactions however many wait.
                match tokio::task::unconstrained(stream.next()).now_or_never() {
                    Some(event) => event?,
                    None => {
                        self.flush(&mut batch, &mut stream, &epoch).await?;
                        continue;
                    }
                }
            };
            match event {
                Event::Committed {
                    end,
                    rows,
                    committed_at,
                } => {
                    batch.rows.extend(rows.into_iter().map(|row| (end, row)));
                    batch.oldest_commit.get_or_insert(committed_at);
                    batch.transactions += 1;
                    batch.end = end;
                    if batch.full() {
                        self.flush(&mut batch, &mut stream, &epoch).await?;
                    }
                }
                // A transaction too large to hold whole: the ones before it
                // first, in commit order.
                Event::Part {
                    begin,
                    offset,
                    rows,
                } => {
                    self.flush(&mut batch, &mut stream, &epoch).await?;
                    self.write_part(begin, offset, &rows, &epoch).await?;
                    batch.parted = true;
                }
                Event::CaughtUp { wal_end } => {
                    self.flush(&mut batch, &mut stream, &epoch).await?;
                    stream.applied(wal_end);
                }
                Event::Relogged { xid } => {
                    // Committed already (the message comes with its
                    // commit): the tables as that transaction left them.
                    self.flush(&mut batch, &mut stream, &epoch).await?;
                    if let Some(xid) = xid {
                        self.until_visible(xid).await?;
                    }
                    stream.set_tables(&self.tables(passed_over).await?)?;
                }
            }
        }
    }

    /// Waits until transaction `xid` is visible to new snapshots: a commit
    /// is in the log, and can be decoded, a moment before it is.
    async fn until_visible(&self, xid: u64) -> Result<(), ProducerError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let visible: bool = sqlx::query_scalar(
                "select pg_catalog.pg_visible_in_snapshot($1::text::pg_catalog.xid8, pg_catalog.pg_current_snapshot())",
            )
            .bind(xid.to_string())
            .fetch_one(&self.pool)
            .await?;
            if visible {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProducerError::NotVisible(xid));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Writes the batch's rows, if any, and tells the server it has them.
    async fn flush(
        &self,
        batch: &mut Batch,
        stream: &mut LogStream,
        epoch: &str,
    ) -> Result<(), ProducerError> {
        if batch.transactions == 0 {
            return Ok(());
        }
        if !batch.rows.is_empty() || batch.parted {
            self.write_committed(&batch.rows, batch.end, epoch, batch.oldest_commit)
                .await?;
        }
        stream.applied(batch.end);
        *batch = Batch::default();
        Ok(())
    }

    /// The log feed's tables now, and `passed_over` those published for
    /// another reason (no guard).
    async fn tables(
        &self,
        passed_over: &[(String, String)],
    ) -> Result<Vec<LoggedTable>, sqlx::Error> {
        let mut tables = logged_tables(&self.pool).await?;
        for (schema, table) in passed_over {
            if !tables
                .iter()
                .any(|t| &t.schema == schema && &t.table == table)
            {
                tables.push(LoggedTable {
                    schema: schema.clone(),
                    table: table.clone(),
                    guards: Vec::new(),
                });
            }
        }
        Ok(tables)
    }

    /// The end of the last transaction written, 0 if none.
    async fn progress(&self) -> Result<u64, sqlx::Error> {
        let applied: Option<i64> = sqlx::query_scalar(
            "select (applied operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8
               from bloom_guard.log_progress where slot = $1",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await?;
        Ok(applied.map_or(0, |applied| applied.unsigned_abs()))
    }
}

/// Logs a producer's failure as a warning, or at debug level when it is
/// the one last warned of.
fn warn_once(warned: &mut Option<String>, error: &dyn std::error::Error) {
    let message = crate::error::error_chain(error);
    if warned.as_deref() == Some(message.as_str()) {
        tracing::debug!(error = %message, "the log feed's producer failed again");
    } else {
        tracing::warn!(error = %message, retry_in = ?RETRY, "the log feed's producer stopped; the guards on the log feed let requests through until it streams again");
        *warned = Some(message);
    }
}

impl Producer {
    /// The producer of the database `pool` reaches at `url`, on the log
    /// feed's slot and publication.
    pub(crate) async fn new(pool: PgPool, url: &str) -> Result<Self, sqlx::Error> {
        Ok(Self {
            slot: slot_name(&pool).await?,
            server: Server::of(&pool).await?,
            pool,
            url: url.to_owned(),
            publication: super::install::PUBLICATION.to_owned(),
        })
    }
}
