//! The producer's writes to the feed: a batch of committed transactions'
//! rows with the progress they reach, in one transaction; the progress
//! alone past commits of other tables, within [`PROGRESS_EVERY`]; the user
//! lock that marks the point it caught up with; and a new epoch of the
//! feed.

use std::time::Duration;

use sqlx::{Connection as _, MySqlConnection};

use super::error::BinlogError;
use super::feed::AT_POINT_LOCK;
use super::position::{log_end, ordinal, BinlogPoint};
use super::stream::Committed;

/// The least time between two writes of progress alone (commits of other
/// tables): a barrier's read that cannot wait for it takes the lock the
/// producer holds when it has caught up (`feed.rs`).
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(5);

/// Feed rows per `INSERT`.
const INSERT_ROWS: usize = 500;

/// The `INSERT` of `rows`, every value a literal: one text-protocol
/// statement. Bound parameters would make each row count its own prepared
/// statement, and the server's cache of them would churn: closing one is
/// a packet without a reply, and the next statement waits for its
/// acknowledgement (Nagle's algorithm against a delayed ACK: 40 ms here,
/// on every write).
fn insert_statement(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut statement = String::from(
        "insert into bloom_guard_log_changes (guard, kind, k, at, seq, pos, point) values ",
    );
    for (i, (feed, kind, key, seq, pos)) in rows.iter().enumerate() {
        if i > 0 {
            statement.push_str(", ");
        }
        // Names and keys as hexadecimal literals: any bytes, nothing to
        // escape; the kind is one of the feed's letters (`d`, `i`, `r`).
        let _ = write!(
            statement,
            "(x'{}', '{}', x'{}', unix_timestamp(), {seq}, {pos}, {})",
            hex(feed.as_bytes()),
            kind,
            hex(key.as_deref().unwrap_or_default()),
            ordinal(*seq, *pos),
        );
    }
    statement
}

/// `bytes` as lower-case hexadecimal digits.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// A feed row as written: the feed, the kind, the key (none for a
/// resync), and the end point of its transaction (file sequence, offset).
type Row = (String, char, Option<Vec<u8>>, u64, u64);

/// What the producer has written, and what it owes.
pub(super) struct Writer {
    pub(super) server: String,
    pub(super) epoch: String,
    /// The progress written last.
    pub(super) written: BinlogPoint,
    /// A point past `written` that only commits of other tables reached:
    /// written within [`PROGRESS_EVERY`].
    pub(super) unwritten: Option<BinlogPoint>,
    pub(super) last_write: tokio::time::Instant,
}

impl Writer {
    /// Whether progress past commits of other tables waits longer than
    /// [`PROGRESS_EVERY`].
    pub(super) fn due(&self) -> bool {
        self.unwritten.is_some() && self.last_write.elapsed() >= PROGRESS_EVERY
    }

    /// Takes a batch of committed transactions: writes their rows at once,
    /// the progress past commits of other tables soon, and nothing for
    /// commits of the feed's own tables (its own progress among them).
    pub(super) async fn take(
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
    pub(super) async fn write(
        &mut self,
        connection: &mut MySqlConnection,
        rows: Vec<Row>,
    ) -> Result<(), BinlogError> {
        let Some(point) = self.unwritten.take() else {
            return Ok(());
        };
        let mut tx = connection.begin().await?;
        for chunk in rows.chunks(INSERT_ROWS) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(insert_statement(chunk)))
                .execute(&mut *tx)
                .await?;
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
pub(super) async fn mark(
    connection: &mut MySqlConnection,
    point: &BinlogPoint,
    before: Option<&BinlogPoint>,
) -> Result<(), sqlx::Error> {
    let at = |point: &BinlogPoint| (point.sequence().unwrap_or(0), point.pos);
    let (seq, pos) = at(point);
    match before {
        Some(before) => {
            let (before_seq, before_pos) = at(before);
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select get_lock({AT_POINT_LOCK}, 0), release_lock({AT_POINT_LOCK})"
            )))
            .bind(seq)
            .bind(pos)
            .bind(before_seq)
            .bind(before_pos)
            .execute(connection)
            .await?;
        }
        None => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select get_lock({AT_POINT_LOCK}, 0)"
            )))
            .bind(seq)
            .bind(pos)
            .execute(connection)
            .await?;
        }
    }
    Ok(())
}

/// Starts a new epoch of the feed at the log's end: the rows of the old
/// one go, and every follower, at a position of the old epoch, rebuilds.
pub(super) async fn start_over(
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

#[cfg(test)]
mod tests {
    use super::{hex, insert_statement};

    #[test]
    fn every_value_of_a_feed_row_is_a_literal() {
        assert_eq!(hex(&[0x00, 0x7f, 0xff, b'a']), "007fff61");
        let statement = insert_statement(&[
            ("it's".to_owned(), 'i', Some(b"k\\'x".to_vec()), 3, 120),
            ("items".to_owned(), 'r', None, 3, 200),
        ]);
        assert!(
            statement.ends_with(
                "(x'69742773', 'i', x'6b5c2778', unix_timestamp(), 3, 120, 3298534883448), \
             (x'6974656d73', 'r', x'', unix_timestamp(), 3, 200, 3298534883528)"
            ),
            "{statement}"
        );
    }
}
