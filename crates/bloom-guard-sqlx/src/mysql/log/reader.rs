//! A reader of the binary log: streams it once and writes the feeds of
//! several databases (the server's reader: every database someone wants
//! and its role may write), or of one (a database's own, while the
//! server's reader does not feed it). See `producer.rs` for the election.
//!
//! Each feed resumes from its own progress. The stream starts at the
//! earliest of them, and a feed takes only the transactions that end after
//! its progress, so a database taken while the stream runs ahead of its
//! progress restarts the stream from there; one whose progress is another
//! server's, or missing, starts a new epoch at the log's end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use mysql_async::prelude::Queryable as _;
use sqlx::MySqlConnection;
use tokio_util::sync::CancellationToken;

use super::error::{server_error, BinlogError};
use super::feed::AT_POINT_LOCK_OF;
use super::position::{log_end, BinlogPoint, SERVER};
use super::producer::{ASKED_LOCK, FED_LOCK, SERVER_LOCK, WANTED_LOCK};
use super::registry::add_logged_tables;
use super::stream::{Committed, LoggedTables, Transactions};
use super::write::{blocked, start_over, Feed, Writer};
use crate::mysql::names::ident;

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

/// How often a reader looks at who wants and who feeds each database.
pub(super) const RESCAN: Duration = Duration::from_secs(1);

/// How long the reader's statements wait for a lock on a feed's tables
/// (`lock_wait_timeout`: table and metadata locks).
const LOCK_WAIT: u32 = 2;

/// How long the server's reader leaves a database to its own instances
/// after a statement on its feed failed (its tables held locked past
/// [`LOCK_WAIT`], by a dump with `LOCK TABLES`), and after it found it may
/// not write its feed or see its watched tables: one database does not
/// hold back the feeds of the others.
const SET_ASIDE: Duration = Duration::from_secs(30);
const BARRED: Duration = Duration::from_secs(300);

/// How long a database stays followed by nobody before the server's
/// reader leaves it: an instance's restart is not a reason to rewind.
const LEAVE_AFTER: Duration = Duration::from_secs(5);

/// How far behind the server's stream a database's progress may be for the
/// server's reader to take it (in the stream's file, in bytes): one further
/// behind is caught up by its own instances first, so that the others'
/// feeds do not wait while the stream reads the log again, unless nobody
/// took it within [`FAR_WAIT`].
const FAR: u64 = 64 << 20;
const FAR_WAIT: Duration = Duration::from_secs(30);

/// The databases a server's reader leaves to their own instances, and
/// until when: kept by the candidate from one of its readers to the next.
#[derive(Debug, Default)]
pub(super) struct Shunned {
    until: BTreeMap<String, tokio::time::Instant>,
}

impl Shunned {
    fn leaves(&mut self, database: &str) -> bool {
        let now = tokio::time::Instant::now();
        self.until.retain(|_, until| *until > now);
        self.until.contains_key(database)
    }

    fn leave_for(&mut self, database: &str, period: Duration) {
        self.until
            .insert(database.to_owned(), tokio::time::Instant::now() + period);
    }
}

/// Which databases a reader feeds.
pub(super) enum Scope {
    /// Every database with the feed's tables that a candidate wants, no
    /// other reader feeds, and the reader's role may write.
    Server,
    /// The one database whose `FED_LOCK` the reader's connection holds,
    /// until the server's reader asks for it (or, where there is none,
    /// this one becomes it).
    Database(String),
}

/// How a stream ended without an error.
enum Streamed {
    Stopped,
    /// A database was taken behind the stream: it starts again from the
    /// earliest progress.
    Restart,
    /// The database's own reader handed it to the server's.
    HandedOver,
}

pub(super) struct Reader<'a> {
    scope: Scope,
    url: &'a str,
    /// The database of the candidate the reader was elected as.
    own: &'a str,
    shunned: &'a mut Shunned,
    /// Databases fed by another reader that the server's reader asked for.
    asked: BTreeSet<String>,
    /// Since when each database fed here has been followed by nobody.
    unwanted_since: BTreeMap<String, tokio::time::Instant>,
    /// Since when each database left to catch up alone has been so.
    far_since: BTreeMap<String, tokio::time::Instant>,
}

/// Whether a database's feed can be written by the server's reader, and
/// why not.
type Feedable = Result<(), String>;

impl<'a> Reader<'a> {
    pub(super) fn new(scope: Scope, url: &'a str, own: &'a str, shunned: &'a mut Shunned) -> Self {
        Self {
            scope,
            url,
            own,
            shunned,
            asked: BTreeSet::new(),
            unwanted_since: BTreeMap::new(),
            far_since: BTreeMap::new(),
        }
    }

    /// Reads until stopped, failed, or handed over. The caller's connection
    /// holds the server's lock (`Scope::Server`) or the database's.
    pub(super) async fn read(
        mut self,
        connection: &mut MySqlConnection,
        stop: &CancellationToken,
    ) -> Result<(), BinlogError> {
        let server: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {SERVER}")))
            .fetch_one(&mut *connection)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "set session lock_wait_timeout = {LOCK_WAIT}"
        )))
        .execute(&mut *connection)
        .await?;
        let mut writer = Writer::new(server);
        match &self.scope {
            Scope::Database(database) => {
                let database = database.clone();
                let feed = stored_feed(connection, &writer.server, &database).await?;
                writer.feeds.insert(database, feed);
            }
            Scope::Server => {
                self.rescan(connection, &mut writer, None).await?;
            }
        }
        loop {
            let start = match writer.earliest() {
                Some(point) => point.clone(),
                None => log_end(connection).await?,
            };
            match self
                .stream(connection, &mut writer, start.clone(), stop)
                .await
            {
                Err(BinlogError::Stream(mysql_async::Error::Server(error)))
                    if error.code == 1236 =>
                {
                    // The log to resume from is gone (purged, or another
                    // server's): what it held is in no feed.
                    let behind: Vec<String> = writer
                        .feeds
                        .iter()
                        .filter(|(_, feed)| feed.written == start)
                        .map(|(database, _)| database.clone())
                        .collect();
                    if behind.is_empty() {
                        return Err(mysql_async::Error::Server(error).into());
                    }
                    for database in behind {
                        tracing::warn!(database, error = %error.message, "the binary log to resume from cannot be read: the feed starts over, every guard rebuilds");
                        if let Some(feed) = writer.forget(&database) {
                            unmark(connection, &database, &feed).await?;
                        }
                        let feed = start_over(connection, &writer.server, &database).await?;
                        writer.feeds.insert(database, feed);
                    }
                }
                Ok(Streamed::Restart) => {}
                Ok(Streamed::Stopped) => return Ok(()),
                Ok(Streamed::HandedOver) => {
                    let databases: Vec<String> = writer.feeds.keys().cloned().collect();
                    for database in databases {
                        leave(connection, &mut writer, &database).await?;
                    }
                    return Ok(());
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The server's reader: takes the databases someone wants that nobody
    /// feeds, asks for those another reader feeds, and leaves those nobody
    /// has wanted for [`LEAVE_AFTER`]. Whether a database taken is behind
    /// `boundary`, the point the stream has reached.
    async fn rescan(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
        boundary: Option<&BinlogPoint>,
    ) -> Result<bool, BinlogError> {
        let listed: Vec<(String, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select cast(table_schema as char),
                        is_used_lock({}) is not null,
                        is_used_lock({}) is not null
                   from information_schema.tables where table_name = 'bloom_guard_log_progress'",
            WANTED_LOCK.replace('?', "table_schema"),
            FED_LOCK.replace('?', "table_schema"),
        )))
        .fetch_all(&mut *connection)
        .await?;
        let now = tokio::time::Instant::now();
        let mut behind = false;
        let mut seen = BTreeSet::new();
        for (database, wanted, fed) in listed {
            seen.insert(database.clone());
            let mut wanted = wanted == 1;
            if !wanted && database == self.own {
                // The candidate's own database: its lock may have been
                // held still by a connection closing as it stood.
                let taken: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "select get_lock({WANTED_LOCK}, 0)"
                )))
                .bind(&database)
                .fetch_one(&mut *connection)
                .await?;
                wanted = taken == Some(1);
            }
            if writer.feeds.contains_key(&database) {
                if wanted {
                    self.unwanted_since.remove(&database);
                } else if now - *self.unwanted_since.entry(database.clone()).or_insert(now)
                    >= LEAVE_AFTER
                {
                    tracing::debug!(
                        database,
                        "no instance follows the database any more: its feed stops"
                    );
                    self.unwanted_since.remove(&database);
                    leave(connection, writer, &database).await?;
                }
                continue;
            }
            if !wanted || self.shunned.leaves(&database) {
                self.unask(connection, &database).await?;
                continue;
            }
            if fed == 1 {
                // Another reader feeds it (its own instances'): asked for
                // once this one may feed it, and handed over when caught up.
                if !self.asked.contains(&database) {
                    tracing::debug!(database, "another reader feeds the database: asked for it");
                    match self.feedable(connection, &database).await {
                        Ok(Ok(())) => {
                            sqlx::query(sqlx::AssertSqlSafe(format!(
                                "select get_lock({ASKED_LOCK}, 0)"
                            )))
                            .bind(&database)
                            .execute(&mut *connection)
                            .await?;
                            self.asked.insert(database);
                        }
                        Ok(Err(why)) => self.bar(&database, &why),
                        Err(error) => self.set_aside(&database, error)?,
                    }
                }
                continue;
            }
            match self.take(connection, writer, &database, boundary).await {
                Ok(taken_behind) => behind |= taken_behind,
                Err(error) => self.set_aside(&database, error)?,
            }
        }
        // A database dropped, or whose tables the role no longer sees.
        let gone: Vec<String> = writer
            .feeds
            .keys()
            .filter(|database| !seen.contains(*database))
            .cloned()
            .collect();
        for database in gone {
            leave(connection, writer, &database).await?;
        }
        Ok(behind)
    }

    /// Takes `database`, unfed, if this reader gets its lock, may feed it,
    /// and its progress is not far behind `boundary`; whether it is behind.
    async fn take(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
        database: &str,
        boundary: Option<&BinlogPoint>,
    ) -> Result<bool, BinlogError> {
        let taken: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "select get_lock({FED_LOCK}, 0)"
        )))
        .bind(database)
        .fetch_one(&mut *connection)
        .await?;
        if taken != Some(1) {
            return Ok(false);
        }
        let feed = match self.feedable(connection, database).await {
            Ok(Ok(())) => stored_feed(connection, &writer.server, database).await,
            Ok(Err(why)) => {
                self.bar(database, &why);
                release(connection, FED_LOCK, database).await?;
                return Ok(false);
            }
            Err(error) => Err(error),
        };
        let feed = match feed {
            Ok(feed) => feed,
            Err(error) => {
                let _ = release(connection, FED_LOCK, database).await;
                return Err(error);
            }
        };
        if let Some(boundary) = boundary {
            let now = tokio::time::Instant::now();
            if far(&feed.written, boundary)
                && now - *self.far_since.entry(database.to_owned()).or_insert(now) < FAR_WAIT
            {
                // Its own instances catch it up, and hand it over.
                tracing::debug!(
                    database,
                    "the database's feed is far behind the server's stream: its own instances catch it up"
                );
                release(connection, FED_LOCK, database).await?;
                return Ok(false);
            }
        }
        self.far_since.remove(database);
        let behind = boundary.is_some_and(|boundary| !feed.written.reaches(boundary));
        tracing::debug!(
            database,
            from = %feed.written,
            behind,
            "the binary log reader feeds the database"
        );
        writer.feeds.insert(database.to_owned(), feed);
        self.unask(connection, database).await?;
        Ok(behind)
    }

    /// Whether the server's reader may feed `database`: write its feed
    /// tables and see its watched tables (a table it cannot see, it would
    /// read no row of, and the feed's progress would pass them).
    async fn feedable(
        &mut self,
        connection: &mut MySqlConnection,
        database: &str,
    ) -> Result<Feedable, BinlogError> {
        if let Err(error) = may_write(connection, database).await {
            if is_denied(&error) {
                return Ok(Err(format!("it may not write the feed's tables ({error})")));
            }
            return Err(blocked(database, error));
        }
        let mut tables = LoggedTables::default();
        if !add_logged_tables(connection, database, &mut tables).await? {
            return Ok(Err("it cannot see every table on the feed".to_owned()));
        }
        Ok(Ok(()))
    }

    /// Leaves `database` to its own instances: the server's reader may
    /// not feed it.
    fn bar(&mut self, database: &str, why: &str) {
        tracing::info!(
            database,
            why,
            "the server's binary log reader cannot feed this database: its own instances read the log for it"
        );
        self.shunned.leave_for(database, BARRED);
    }

    /// Leaves `database` to its own instances for a while after a statement
    /// on its feed failed; an error of the connection is the reader's.
    fn set_aside(&mut self, database: &str, error: BinlogError) -> Result<(), BinlogError> {
        let statement_failed = matches!(
            error,
            BinlogError::Blocked(_) | BinlogError::Database(sqlx::Error::Database(_))
        );
        if !statement_failed {
            return Err(error);
        }
        tracing::warn!(
            database,
            error = %crate::error::error_chain(&error),
            "a statement on the database's feed failed: the server's binary log reader leaves it to its own instances for now"
        );
        self.shunned.leave_for(database, SET_ASIDE);
        Ok(())
    }

    /// No longer asks for `database`.
    async fn unask(
        &mut self,
        connection: &mut MySqlConnection,
        database: &str,
    ) -> Result<(), BinlogError> {
        if self.asked.remove(database) {
            release(connection, ASKED_LOCK, database).await?;
        }
        Ok(())
    }

    /// A database's own reader: whether it is elected the server's reader
    /// (none was), and whether the server's reader asks for its database.
    async fn server_look(
        &self,
        connection: &mut MySqlConnection,
    ) -> Result<(bool, bool), BinlogError> {
        let Scope::Database(database) = &self.scope else {
            return Ok((false, false));
        };
        let (elected, asked): (Option<i64>, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select get_lock({SERVER_LOCK}, 0), is_used_lock({ASKED_LOCK}) is not null"
        )))
        .bind(database)
        .fetch_one(connection)
        .await?;
        Ok((elected == Some(1), asked == 1))
    }

    /// Writes what the feeds owe. The server's reader sets aside a database
    /// whose feed tables another session holds locked, and writes the
    /// others' without it.
    async fn write(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
    ) -> Result<(), BinlogError> {
        loop {
            match writer.write(connection).await {
                Err(BinlogError::Blocked(database))
                    if matches!(self.scope, Scope::Server)
                        && others_writable(connection, writer, &database).await? =>
                {
                    tracing::warn!(
                        database,
                        "another session holds the database's feed tables locked: the server's binary log reader leaves it to its own instances for now"
                    );
                    leave(connection, writer, &database).await?;
                    self.shunned.leave_for(&database, SET_ASIDE);
                }
                written => return written,
            }
        }
    }

    /// Looks again at the databases to feed (the server's reader) and,
    /// where they or a registry (`changed`) did, at the tables on the feed.
    /// Whether the stream must start again: a database was taken behind
    /// the point it reached, or the tables changed inside a transaction,
    /// whose rows read so far were read for the tables before.
    async fn tables_again(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
        transactions: &mut Transactions,
        mut changed: bool,
    ) -> Result<bool, BinlogError> {
        let mut behind = false;
        if let Scope::Server = self.scope {
            let before: Vec<String> = writer.feeds.keys().cloned().collect();
            behind = self
                .rescan(connection, writer, Some(transactions.boundary()))
                .await?;
            changed |= writer.feeds.keys().ne(before.iter());
        }
        if behind || (changed && transactions.in_transaction()) {
            tracing::debug!(
                behind,
                changed,
                databases = writer.feeds.len(),
                "the binary log reader starts its stream again"
            );
            return Ok(true);
        }
        if changed {
            let tables = self.tables(connection, writer).await?;
            transactions.set_tables(tables);
        }
        Ok(false)
    }

    /// The tables on the feeds of the databases fed. The server's reader
    /// leaves a database whose registry it cannot read, or one of whose
    /// tables it cannot see.
    async fn tables(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
    ) -> Result<LoggedTables, BinlogError> {
        let mut tables = LoggedTables::default();
        let databases: Vec<String> = writer.feeds.keys().cloned().collect();
        for database in databases {
            let mut theirs = LoggedTables::default();
            let read = add_logged_tables(connection, &database, &mut theirs).await;
            match (&self.scope, read) {
                (Scope::Database(_), read) => {
                    // Its own instances' reader: a table gone is a table
                    // whose DDL started its guards over.
                    read?;
                }
                (Scope::Server, Ok(true)) => {}
                (Scope::Server, Ok(false)) => {
                    self.bar(&database, "it cannot see every table on the feed");
                    leave(connection, writer, &database).await?;
                    continue;
                }
                (Scope::Server, Err(error)) => {
                    self.set_aside(&database, error.into())?;
                    leave(connection, writer, &database).await?;
                    continue;
                }
            }
            tables.extend(theirs);
        }
        Ok(tables)
    }

    /// Streams the log from `start` and writes its transactions.
    async fn stream(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
        start: BinlogPoint,
        stop: &CancellationToken,
    ) -> Result<Streamed, BinlogError> {
        let tables = self.tables(connection, writer).await?;
        let mut binlog = open(self.url, &start).await?;
        let mut transactions = Transactions::new(start, tables);
        let mut next_rescan = tokio::time::Instant::now() + RESCAN;
        loop {
            let unmarked = !writer.marked_at(transactions.boundary());
            let event = tokio::select! {
                () = stop.cancelled() => return Ok(Streamed::Stopped),
                () = sleep_until(writer.due_at()) => {
                    self.write(connection, writer).await?;
                    continue;
                }
                // A batch cut short by its bounds left the point it reached
                // unmarked: marked once the stream is quiet a moment, or a
                // refusal would wait for the next commit anywhere.
                () = tokio::time::sleep(MARK_AFTER), if unmarked => {
                    writer.mark(connection, transactions.boundary()).await?;
                    continue;
                }
                () = tokio::time::sleep_until(next_rescan) => {
                    next_rescan = tokio::time::Instant::now() + RESCAN;
                    if let Scope::Database(_) = self.scope {
                        let (elected, asked) = self.server_look(connection).await?;
                        if elected {
                            // No server's reader: this one becomes it.
                            self.scope = Scope::Server;
                        } else if asked && !unmarked {
                            // Handed over once caught up: the server's
                            // reader takes it from a progress near its own
                            // stream.
                            return Ok(Streamed::HandedOver);
                        }
                    }
                    if self.tables_again(connection, writer, &mut transactions, false).await? {
                        return Ok(Streamed::Restart);
                    }
                    continue;
                }
                event = tokio::time::timeout(SILENT, binlog.next()) => event,
            };
            let event = match event {
                Err(_) => {
                    return Err(BinlogError::Lost(
                        "the binary log stream fell silent".to_owned(),
                    ))
                }
                Ok(None) => {
                    return Err(BinlogError::Lost(
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
            // What the stream holds already goes in the same write, up to a
            // transaction that changes the tables on the feed: what follows
            // it is read for the tables after it.
            let mut caught_up = false;
            let taking = tokio::time::Instant::now();
            while !batch.last().is_some_and(changes_tables)
                && events < BATCH_EVENTS
                && rows < BATCH_ROWS
                && taking.elapsed() < BATCH_TIME
            {
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
            let reload = batch.last().is_some_and(changes_tables);
            if writer.take(batch) || writer.due() {
                self.write(connection, writer).await?;
            }
            // A database's registry changed, or one was installed.
            if reload
                && self
                    .tables_again(connection, writer, &mut transactions, true)
                    .await?
            {
                return Ok(Streamed::Restart);
            }
            if caught_up && !writer.marked_at(transactions.boundary()) {
                writer.mark(connection, transactions.boundary()).await?;
            }
        }
    }
}

/// Whether a transaction changes the tables on the feed or their layout:
/// a registry's rows, DDL.
fn changes_tables(committed: &Committed) -> bool {
    committed.tables_changed || !committed.resync.is_empty()
}

/// `database`'s feed from its progress, or started over where the
/// progress is another server's or missing.
async fn stored_feed(
    connection: &mut MySqlConnection,
    server: &str,
    database: &str,
) -> Result<Feed, BinlogError> {
    let stored: Option<(String, String, String, i64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select server, epoch, file, pos from {}.bloom_guard_log_progress where id = 1",
            ident(database)
        )))
        .fetch_optional(&mut *connection)
        .await?;
    match stored {
        Some((stored_server, epoch, file, pos)) if stored_server == server => Ok(Feed::at(
            epoch,
            BinlogPoint {
                file,
                pos: pos.try_into().unwrap_or(4),
            },
        )),
        stored => {
            if stored.is_some() {
                tracing::warn!(database, "the binary log is another server's than the feed's progress (a failover, a restore): the feed starts over, every guard rebuilds");
            }
            start_over(connection, server, database).await
        }
    }
}

/// Whether `point` is far behind `boundary`: in an earlier file, or more
/// than [`FAR`] bytes before it.
fn far(point: &BinlogPoint, boundary: &BinlogPoint) -> bool {
    !point.reaches(boundary)
        && (point.file != boundary.file || boundary.pos.saturating_sub(point.pos) > FAR)
}

/// Whether a feed other than `blocked`'s can be written now: where none can
/// (a global read lock, a backup's), the reader waits rather than leave
/// every database in turn.
async fn others_writable(
    connection: &mut MySqlConnection,
    writer: &Writer,
    blocked: &str,
) -> Result<bool, BinlogError> {
    let Some(other) = writer.feeds.keys().find(|database| *database != blocked) else {
        return Ok(false);
    };
    match may_write(connection, other).await {
        Ok(()) => Ok(true),
        Err(error) if is_lock_wait(&error) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Stops feeding `database`: its locks go, and what it owes with them; its
/// progress stays as written, and whoever feeds it next reads on from
/// there.
async fn leave(
    connection: &mut MySqlConnection,
    writer: &mut Writer,
    database: &str,
) -> Result<(), BinlogError> {
    if let Some(feed) = writer.forget(database) {
        unmark(connection, database, &feed).await?;
    }
    release(connection, FED_LOCK, database).await
}

/// Releases the lock `feed` holds for the point it marked.
async fn unmark(
    connection: &mut MySqlConnection,
    database: &str,
    feed: &Feed,
) -> Result<(), BinlogError> {
    if let Some(marked) = &feed.marked {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "select release_lock({AT_POINT_LOCK_OF})"
        )))
        .bind(database)
        .bind(marked.sequence().unwrap_or(0))
        .bind(marked.pos)
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}

async fn release(
    connection: &mut MySqlConnection,
    lock: &str,
    database: &str,
) -> Result<(), BinlogError> {
    sqlx::query(sqlx::AssertSqlSafe(format!("select release_lock({lock})")))
        .bind(database)
        .execute(connection)
        .await?;
    Ok(())
}

/// Fails where the connection's role may not write `database`'s feed: the
/// rights are checked before any row is, so the statements change
/// nothing and log nothing.
async fn may_write(connection: &mut MySqlConnection, database: &str) -> Result<(), sqlx::Error> {
    let database = ident(database);
    for statement in [
        format!("update {database}.bloom_guard_log_progress set pos = pos where 1 = 0"),
        format!("delete from {database}.bloom_guard_log_changes where 1 = 0"),
        format!(
            "insert into {database}.bloom_guard_log_changes (guard, kind, k, at, seq, pos, point)
             select guard, kind, k, at, seq, pos, point from {database}.bloom_guard_log_changes
              where 1 = 0"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *connection)
            .await?;
    }
    Ok(())
}

/// Whether `error` is a lock wait that timed out (`ER_LOCK_WAIT_TIMEOUT`).
fn is_lock_wait(error: &sqlx::Error) -> bool {
    server_error(error) == Some(1205)
}

/// Whether `error` is the server's refusal of a right (on a table, a
/// column, a database).
fn is_denied(error: &sqlx::Error) -> bool {
    matches!(server_error(error), Some(1044 | 1142 | 1143))
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

#[cfg(test)]
mod tests {
    use super::{far, BinlogPoint};

    fn at(file: &str, pos: u64) -> BinlogPoint {
        BinlogPoint {
            file: file.to_owned(),
            pos,
        }
    }

    #[test]
    fn only_a_point_well_behind_the_stream_is_far() {
        let stream = at("binlog.000007", 100 << 20);
        assert!(!far(&at("binlog.000007", 90 << 20), &stream));
        assert!(far(&at("binlog.000007", 4), &stream));
        assert!(far(&at("binlog.000006", 200 << 20), &stream));
        // Ahead of the stream (a feed started over at the log's end).
        assert!(!far(&at("binlog.000008", 4), &stream));
        assert!(!far(&at("binlog.000007", 200 << 20), &stream));
    }
}
