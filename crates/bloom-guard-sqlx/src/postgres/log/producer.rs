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
//! themselves: the one that holds the stream writes, the others try again
//! every [`RETRY`] and take over when it stops.
//!
//! A transaction's rows and the slot's progress (its commit's end) go in
//! one transaction; the server hears of the progress only after that
//! commits. A transaction the slot sends again (after a crash, or a
//! connection killed before the server heard) ends at or before the
//! progress and is skipped: no change is written twice.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::install::{logged_tables, slot_name};
use super::rows::FeedRow;
use super::stream::{Event, LogStream, LoggedTable, StreamError};

/// The pause before a producer tries the slot again.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// Why a producer's stream stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProducerError {
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// A database's log feed producer.
pub(crate) struct Producer {
    pub(crate) pool: PgPool,
    /// The database's URL, for the replication connection.
    pub(crate) url: String,
    pub(crate) slot: String,
    pub(crate) publication: String,
}

impl Producer {
    /// Produces until `stop`, taking the slot whenever it is free.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut passed_over = Vec::new();
        while !stop.is_cancelled() {
            match self.produce(&stop, &passed_over).await {
                Ok(()) => return,
                // A table put on the feed since the stream started comes
                // in the next one at once; one published for another
                // reason is passed over from then on.
                Err(ProducerError::Stream(StreamError::Unwatched(schema, table))) => {
                    tracing::debug!(%schema, %table, "a published table the stream was not told of; starting again");
                    passed_over.push((schema, table));
                    continue;
                }
                Err(error) => {
                    tracing::debug!(error = %crate::error::error_chain(&error), "the log feed's slot is not streaming here; trying again");
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RETRY) => {}
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
        let after = self.progress().await?;
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
        let mut stream =
            LogStream::start(&self.url, &self.slot, &self.publication, &tables, after).await?;
        tracing::info!(slot = %self.slot, "streaming the log feed's slot");
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => {
                    stream.stop().await;
                    return Ok(());
                }
                event = stream.next() => event?,
            };
            match event {
                Event::Committed { end, rows } => {
                    if !rows.is_empty() {
                        self.write(&rows, end).await?;
                    }
                    stream.applied(end);
                }
                Event::CaughtUp { wal_end } => stream.applied(wal_end),
            }
        }
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

    /// Writes `rows` and the progress `end` in one transaction.
    async fn write(&self, rows: &[FeedRow], end: u64) -> Result<(), sqlx::Error> {
        let (mut guards, mut kinds, mut keys) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            guards.push(row.guard.as_str());
            kinds.push(char::from(row.kind).to_string());
            keys.push(row.key.as_str());
        }
        let end = i64::try_from(end).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "insert into bloom_guard.log_changes (lsn, guard, kind, key)
             select '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $4::pg_catalog.numeric,
                    g, k::\"char\", key
               from rows from (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),
                               pg_catalog.unnest($3::text[])) as r(g, k, key)",
        )
        .bind(&guards)
        .bind(&kinds)
        .bind(&keys)
        .bind(end)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "insert into bloom_guard.log_progress (slot, applied)
             values ($1, '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $2::pg_catalog.numeric)
             on conflict (slot) do update set applied = excluded.applied",
        )
        .bind(&self.slot)
        .bind(end)
        .execute(&mut *tx)
        .await?;
        // Followers read at once; the producer is no writer of the user's,
        // so its commit may take the notification lock.
        sqlx::query("select pg_catalog.pg_notify('bloom_guard', '*')")
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}

impl Producer {
    /// The producer of the database `pool` reaches at `url`, on the log
    /// feed's slot and publication.
    pub(crate) async fn new(pool: PgPool, url: &str) -> Result<Self, sqlx::Error> {
        Ok(Self {
            slot: slot_name(&pool).await?,
            pool,
            url: url.to_owned(),
            publication: super::install::PUBLICATION.to_owned(),
        })
    }
}
