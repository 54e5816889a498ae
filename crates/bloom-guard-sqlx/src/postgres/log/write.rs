//! The producer's writes to the feed: a batch of committed transactions
//! with the slot's progress, and the parts of a transaction too large to
//! hold whole.
//!
//! A transaction of more than [`PART_ROWS`](super::stream::PART_ROWS) feed
//! rows is written in parts as it arrives, each in a transaction of its
//! own, at the position just past its commit's start: no reader's bound
//! (the progress, the slot's confirmed position, both ends of commits)
//! falls between that and the commit's end, so no reader sees a part
//! before the transaction's last rows are written with its end. The
//! progress row records how many rows of that transaction are written.
//! After a crash the slot sends the transaction again from its first row:
//! its rows are made again from there, under the guards its tables have
//! then, and the rows of the earlier try are dropped (a count alone could
//! skip or repeat rows if a guard was added or taken off meanwhile).

use sqlx::{PgConnection, Postgres, Transaction};

use super::error::ProducerError;
use super::producer::Producer;
use super::rows::FeedRow;

/// The progress row, locked: its end, and the rows of a transaction
/// written in part (its position, how many).
struct Progress {
    applied: u64,
    part_at: u64,
    part_rows: u64,
}

impl Producer {
    /// Writes `rows`, each at its transaction's end, and the progress
    /// `end` in one transaction, durably (the server forgets the log
    /// before `end` once told), in one round trip
    /// (`bloom_guard.log_write`). Under the progress row's lock, the rows
    /// at or before the progress another producer wrote are left out, and
    /// the progress only moves on: two producers (one stalled while the
    /// other took the slot) never write a change twice.
    #[cfg(test)]
    pub(super) async fn write(
        &self,
        rows: &[(u64, FeedRow)],
        end: u64,
        epoch: &str,
    ) -> Result<(), ProducerError> {
        self.write_committed(rows, end, epoch, None).await
    }

    /// [`write`](Self::write), with the batch's first commit time
    /// (microseconds since 2000-01-01, the server's clock) for the
    /// commit-to-feed lag.
    pub(super) async fn write_committed(
        &self,
        rows: &[(u64, FeedRow)],
        end: u64,
        epoch: &str,
        oldest_commit: Option<i64>,
    ) -> Result<(), ProducerError> {
        let mut columns = Columns::default();
        for (row_end, row) in rows {
            columns.push(*row_end, row);
        }
        let written: i64 = sqlx::query_scalar(
            "select bloom_guard.log_write($1, $2, '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $3::pg_catalog.numeric,
                                          $4, $5, $6, $7,
                                          coalesce(timestamptz '2000-01-01 00:00:00+00' operator(pg_catalog.+) ($8::pg_catalog.int8 operator(pg_catalog.*) interval '1 microsecond'),
                                                   pg_catalog.clock_timestamp()))",
        )
        .bind(&self.slot)
        .bind(epoch)
        .bind(lsn(end))
        .bind(&columns.guards)
        .bind(&columns.kinds)
        .bind(&columns.keys)
        .bind(&columns.ends)
        .bind(oldest_commit)
        .fetch_one(&self.pool)
        .await?;
        match usize::try_from(written) {
            Err(_) => Err(ProducerError::SlotRemade),
            Ok(written) => {
                if written < rows.len() {
                    tracing::debug!(
                        skipped = rows.len() - written,
                        "another producer wrote some of these changes"
                    );
                }
                Ok(())
            }
        }
    }

    /// Writes a part of the transaction whose commit starts at `begin`:
    /// `rows`, the transaction's rows from its `offset`th on, at
    /// `begin + 1`, leaving out those written already.
    pub(super) async fn write_part(
        &self,
        begin: u64,
        offset: u64,
        rows: &[FeedRow],
        epoch: &str,
    ) -> Result<(), ProducerError> {
        let at = begin + 1;
        let mut tx = self.pool.begin().await?;
        let progress = self.lock(&mut tx, epoch).await?;
        if progress.applied >= at {
            // Written whole already, by this slot's stream before a crash
            // or by another producer.
            return Ok(tx.commit().await?);
        }
        let written = match (progress.part_at == at, offset) {
            // The transaction sent again from its first row (a crash, a
            // killed connection, another producer): its rows are made
            // again, under the tables' guards of now, and those written
            // before are dropped, whatever guards they were made under
            // (none was readable: they wait for the transaction's end).
            (true, 0) if progress.part_rows > 0 => {
                sqlx::query("delete from bloom_guard.log_changes where lsn = '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $1::pg_catalog.numeric")
                    .bind(lsn(at))
                    .execute(&mut *tx)
                    .await?;
                0
            }
            (true, _) => progress.part_rows,
            (false, _) => 0,
        };
        let skip = usize::try_from(written.saturating_sub(offset)).unwrap_or(usize::MAX);
        insert(&mut tx, rows.iter().skip(skip).map(|row| (at, row))).await?;
        let total = written.max(offset + rows.len() as u64);
        sqlx::query(
            "update bloom_guard.log_progress
                set part_at = '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) $2::pg_catalog.numeric,
                    part_rows = $3
              where slot = $1",
        )
        .bind(&self.slot)
        .bind(lsn(at))
        .bind(i64::try_from(total).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        Ok(tx.commit().await?)
    }

    /// Locks the progress row (made if missing) and checks the slot this
    /// stream began on is the slot still: a slot made again since (its
    /// feed started over) takes no row of this stream's. A making updates
    /// the progress row too: under its lock, this sees one that committed,
    /// and one to come waits for this commit (and deletes these rows, if
    /// it starts the feed over).
    async fn lock(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        epoch: &str,
    ) -> Result<Progress, ProducerError> {
        sqlx::query("set local synchronous_commit = on")
            .execute(&mut **tx)
            .await?;
        sqlx::query(
            "insert into bloom_guard.log_progress (slot, applied) values ($1, '0/0')
             on conflict (slot) do nothing",
        )
        .bind(&self.slot)
        .execute(&mut **tx)
        .await?;
        let (applied, part_at, part_rows): (i64, i64, i64) = sqlx::query_as(
            "select (applied operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                    (coalesce(part_at, '0/0') operator(pg_catalog.-) '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,
                    part_rows
               from bloom_guard.log_progress where slot = $1 for update",
        )
        .bind(&self.slot)
        .fetch_one(&mut **tx)
        .await?;
        if super::slot::epoch(&mut **tx).await? != epoch {
            return Err(ProducerError::SlotRemade);
        }
        Ok(Progress {
            applied: applied.unsigned_abs(),
            part_at: part_at.unsigned_abs(),
            part_rows: part_rows.unsigned_abs(),
        })
    }
}

/// Feed rows as the arrays a statement takes.
#[derive(Default)]
struct Columns<'a> {
    ends: Vec<i64>,
    guards: Vec<&'a str>,
    kinds: Vec<&'static str>,
    keys: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, end: u64, row: &'a FeedRow) {
        self.ends.push(lsn(end));
        self.guards.push(row.guard.as_str());
        self.kinds.push(match row.kind {
            b'i' => "i",
            b'd' => "d",
            b't' => "t",
            _ => "r",
        });
        self.keys.push(row.key.as_str());
    }
}

/// Inserts `rows`, each at its position, in one statement.
async fn insert<'a>(
    connection: &mut PgConnection,
    rows: impl Iterator<Item = (u64, &'a FeedRow)>,
) -> Result<(), sqlx::Error> {
    let mut columns = Columns::default();
    for (end, row) in rows {
        columns.push(end, row);
    }
    if columns.ends.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into bloom_guard.log_changes (lsn, guard, kind, key)
         select '0/0'::pg_catalog.pg_lsn operator(pg_catalog.+) e::pg_catalog.numeric,
                g, k::\"char\", key
           from rows from (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),
                           pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::int8[]))
                as r(g, k, key, e)",
    )
    .bind(&columns.guards)
    .bind(&columns.kinds)
    .bind(&columns.keys)
    .bind(&columns.ends)
    .execute(connection)
    .await?;
    Ok(())
}

/// A position as the `int8` the statements take.
fn lsn(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}
