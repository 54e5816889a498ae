//! The producer's writes to the feed: a batch of committed transactions'
//! rows with the progress they reach, in one transaction; the progress
//! alone past commits of other tables, within [`PROGRESS_EVERY`]; the user
//! lock that marks the point it caught up with; and a new epoch of the
//! feed.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{Connection as _, MySqlConnection};

use super::error::{server_error, BinlogError};
use super::feed::AT_POINT_LOCK_OF;
use super::position::{log_end, ordinal, BinlogPoint};
use super::stream::{Committed, FeedId};
use crate::mysql::names::ident;

/// The least time between two writes of progress alone (commits of other
/// tables): a barrier's read that cannot wait for it takes the lock the
/// producer holds when it has caught up (`feed.rs`).
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(5);

/// Feed rows per `INSERT`.
const INSERT_ROWS: usize = 500;

/// The `INSERT` of `rows` into `database`'s feed, every value a literal:
/// one text-protocol statement. Bound parameters would make each row
/// count its own prepared statement, and the server's cache of them would
/// churn: closing one is a packet without a reply, and the next statement
/// waits for its acknowledgement (Nagle's algorithm against a delayed ACK:
/// 40 ms here, on every write).
fn insert_statement(database: &str, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut statement = format!(
        "insert into {}.bloom_guard_log_changes (guard, kind, k, at, seq, pos, point) values ",
        ident(database)
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

/// One database's feed as its producer writes it.
#[derive(Debug)]
pub(super) struct Feed {
    pub(super) epoch: String,
    /// The progress written last: transactions that end at or before it
    /// are in the feed already (a stream started before it, for another
    /// database, reads them again).
    pub(super) written: BinlogPoint,
    /// A point past `written` that only commits of other tables reached:
    /// written within [`PROGRESS_EVERY`].
    pub(super) unwritten: Option<BinlogPoint>,
    /// The point whose lock the producer holds for this database (`mark`).
    pub(super) marked: Option<BinlogPoint>,
}

impl Feed {
    /// The feed of `epoch`, written up to `written`.
    pub(super) fn at(epoch: String, written: BinlogPoint) -> Self {
        Self {
            epoch,
            written,
            unwritten: None,
            marked: None,
        }
    }
}

/// What the producer has written for each database it feeds, and what it
/// owes.
///
/// Two facts carry the argument that no transaction is written twice or
/// skipped: `pending` holds rows only between [`Writer::take`] and a
/// [`Writer::write`] that commits them with the progress past them (a
/// failed write keeps both owed; a database left drops both, and whoever
/// feeds it next reads again from its progress); and `unwritten` never
/// covers a transaction with rows of its database (such a transaction is
/// written at once), so it may outlive a restart of the stream.
pub(super) struct Writer {
    pub(super) server: String,
    pub(super) feeds: BTreeMap<String, Feed>,
    /// Rows taken and not written yet, by database.
    pending: BTreeMap<String, Vec<Row>>,
    pub(super) last_write: tokio::time::Instant,
}

impl Writer {
    pub(super) fn new(server: String) -> Self {
        Self {
            server,
            feeds: BTreeMap::new(),
            pending: BTreeMap::new(),
            last_write: tokio::time::Instant::now(),
        }
    }

    /// When progress past commits of other tables is due, if it waits.
    pub(super) fn due_at(&self) -> Option<tokio::time::Instant> {
        self.feeds
            .values()
            .any(|feed| feed.unwritten.is_some())
            .then_some(self.last_write + PROGRESS_EVERY)
    }

    /// Whether progress past commits of other tables waits longer than
    /// [`PROGRESS_EVERY`].
    pub(super) fn due(&self) -> bool {
        self.due_at()
            .is_some_and(|due| tokio::time::Instant::now() >= due)
    }

    /// The earliest progress among the feeds: a stream for all of them
    /// starts there.
    pub(super) fn earliest(&self) -> Option<&BinlogPoint> {
        self.feeds
            .values()
            .map(|feed| &feed.written)
            .reduce(|a, b| if a.reaches(b) { b } else { a })
    }

    /// Takes a batch of committed transactions, and says whether to write
    /// now: their rows go at once, the progress past commits of other
    /// tables soon, and nothing for commits of the feeds' own tables (their
    /// progress among them). A database's feed takes only what ends after
    /// its progress.
    pub(super) fn take(&mut self, batch: Vec<Committed>) -> bool {
        let mut now = false;
        for committed in batch {
            let Some(end) = committed.end else { continue };
            let seq = end.sequence().unwrap_or(0);
            for (database, feed) in &mut self.feeds {
                if feed.written.reaches(&end) {
                    continue;
                }
                let mine = |id: &FeedId| id.database == *database;
                now |= committed.tables_changed
                    || committed.rows.iter().any(|(id, ..)| mine(id))
                    || committed.resync.iter().any(mine);
                let new_file = end.file != feed.written.file;
                if committed.foreign || new_file || feed.unwritten.is_some() {
                    // Past a commit of another table: the progress goes as
                    // far.
                    feed.unwritten = Some(end.clone());
                }
            }
            for (id, kind, key) in committed.rows {
                if self.takes(&id.database, &end) {
                    self.pending.entry(id.database).or_default().push((
                        id.feed,
                        kind,
                        Some(key),
                        seq,
                        end.pos,
                    ));
                }
            }
            for id in committed.resync {
                if self.takes(&id.database, &end) {
                    self.pending
                        .entry(id.database)
                        .or_default()
                        .push((id.feed, 'r', None, seq, end.pos));
                }
            }
        }
        now
    }

    /// Stops writing `database`'s feed: what it owes is dropped, its
    /// progress stays as written.
    pub(super) fn forget(&mut self, database: &str) -> Option<Feed> {
        self.pending.remove(database);
        self.feeds.remove(database)
    }

    /// Whether `database`'s feed takes a transaction that ends at `end`.
    fn takes(&self, database: &str, end: &BinlogPoint) -> bool {
        self.feeds
            .get(database)
            .is_some_and(|feed| !feed.written.reaches(end))
    }

    /// Writes the rows taken and each feed's progress up to the last point
    /// taken, in one transaction. A statement on a database whose feed
    /// tables another session holds locked past the session's
    /// `lock_wait_timeout` fails with [`BinlogError::Blocked`], and
    /// everything stays owed.
    pub(super) async fn write(
        &mut self,
        connection: &mut MySqlConnection,
    ) -> Result<(), BinlogError> {
        if self.feeds.values().all(|feed| feed.unwritten.is_none()) {
            return Ok(());
        }
        let mut tx = connection.begin().await?;
        for (database, rows) in &self.pending {
            for chunk in rows.chunks(INSERT_ROWS) {
                sqlx::raw_sql(sqlx::AssertSqlSafe(insert_statement(database, chunk)))
                    .execute(&mut *tx)
                    .await
                    .map_err(|error| blocked(database, error))?;
            }
        }
        for (database, feed) in &self.feeds {
            let Some(point) = &feed.unwritten else {
                continue;
            };
            let updated = sqlx::query(sqlx::AssertSqlSafe(format!(
                "update {}.bloom_guard_log_progress
                    set file = ?, seq = ?, pos = ?, at = cast(unix_timestamp(now(6)) * 1000000 as signed)
                  where id = 1 and epoch = ? and server = ? and file = ? and pos = ?",
                ident(database)
            )))
            .bind(&point.file)
            .bind(point.sequence().unwrap_or(0))
            .bind(point.pos)
            .bind(&feed.epoch)
            .bind(&self.server)
            // From where this producer left it: any other writer of the
            // feed shows here.
            .bind(&feed.written.file)
            .bind(feed.written.pos)
            .execute(&mut *tx)
            .await
            .map_err(|error| blocked(database, error))?
            .rows_affected();
            if updated != 1 {
                return Err(BinlogError::Lost(format!(
                    "the progress of {database}'s feed changed under its producer"
                )));
            }
        }
        tx.commit().await?;
        self.pending.clear();
        for feed in self.feeds.values_mut() {
            if let Some(point) = feed.unwritten.take() {
                feed.written = point;
            }
        }
        self.last_write = tokio::time::Instant::now();
        Ok(())
    }

    /// Whether every feed holds the lock named for `point`.
    pub(super) fn marked_at(&self, point: &BinlogPoint) -> bool {
        self.feeds
            .values()
            .all(|feed| feed.marked.as_ref() == Some(point))
    }

    /// Holds, for each feed, the user lock named for `point` (and no
    /// longer the one for the point before): every commit up to it is
    /// handled, and the stream held nothing more (`feed.rs`).
    pub(super) async fn mark(
        &mut self,
        connection: &mut MySqlConnection,
        point: &BinlogPoint,
    ) -> Result<(), sqlx::Error> {
        let at = |point: &BinlogPoint| (point.sequence().unwrap_or(0), point.pos);
        let (seq, pos) = at(point);
        let mut taken = Vec::new();
        let mut released = Vec::new();
        for (database, feed) in &self.feeds {
            if feed.marked.as_ref() == Some(point) {
                continue;
            }
            taken.push(database);
            if let Some(before) = &feed.marked {
                released.push((database, at(before)));
            }
        }
        if taken.is_empty() {
            return Ok(());
        }
        // One statement: the locks' names bound, so that its text depends
        // only on how many feeds it marks.
        let calls: Vec<String> =
            std::iter::repeat_n(format!("get_lock({AT_POINT_LOCK_OF}, 0)"), taken.len())
                .chain(std::iter::repeat_n(
                    format!("release_lock({AT_POINT_LOCK_OF})"),
                    released.len(),
                ))
                .collect();
        let statement = format!("select {}", calls.join(", "));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(statement));
        for database in &taken {
            query = query.bind(*database).bind(seq).bind(pos);
        }
        for (database, (seq, pos)) in &released {
            query = query.bind(*database).bind(*seq).bind(*pos);
        }
        query.execute(connection).await?;
        for feed in self.feeds.values_mut() {
            feed.marked = Some(point.clone());
        }
        Ok(())
    }
}

/// `error` of a statement on `database`'s feed: [`BinlogError::Blocked`]
/// where it waited out a lock (`ER_LOCK_WAIT_TIMEOUT`).
pub(super) fn blocked(database: &str, error: sqlx::Error) -> BinlogError {
    if server_error(&error) == Some(1205) {
        BinlogError::Blocked(database.to_owned())
    } else {
        error.into()
    }
}

/// Starts a new epoch of `database`'s feed at the log's end: the rows of
/// the old one go, and every follower, at a position of the old epoch,
/// rebuilds.
pub(super) async fn start_over(
    connection: &mut MySqlConnection,
    server: &str,
    database: &str,
) -> Result<Feed, BinlogError> {
    let epoch = format!("{:016x}", fastrand::u64(..));
    let mut tx = connection.begin().await?;
    let end = log_end(&mut tx).await?;
    let seq = end.sequence().unwrap_or(0);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "delete from {}.bloom_guard_log_changes",
        ident(database)
    )))
    .execute(&mut *tx)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "insert into {}.bloom_guard_log_progress (id, server, epoch, file, seq, pos, below_seq, below_pos, at)
         values (1, ?, ?, ?, ?, ?, ?, ?, cast(unix_timestamp(now(6)) * 1000000 as signed))
         on duplicate key update server = values(server), epoch = values(epoch), file = values(file),
                                 seq = values(seq), pos = values(pos), below_seq = values(below_seq),
                                 below_pos = values(below_pos), at = values(at)",
        ident(database)
    )))
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
    Ok(Feed::at(epoch, end))
}

#[cfg(test)]
mod tests {
    use super::{hex, insert_statement};

    #[test]
    fn every_value_of_a_feed_row_is_a_literal() {
        assert_eq!(hex(&[0x00, 0x7f, 0xff, b'a']), "007fff61");
        let statement = insert_statement(
            "shop",
            &[
                ("it's".to_owned(), 'i', Some(b"k\\'x".to_vec()), 3, 120),
                ("items".to_owned(), 'r', None, 3, 200),
            ],
        );
        assert!(statement.starts_with("insert into `shop`.bloom_guard_log_changes"));
        assert!(
            statement.ends_with(
                "(x'69742773', 'i', x'6b5c2778', unix_timestamp(), 3, 120, 3298534883448), \
             (x'6974656d73', 'r', x'', unix_timestamp(), 3, 200, 3298534883528)"
            ),
            "{statement}"
        );
    }
}
