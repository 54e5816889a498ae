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

use super::error::BinlogError;
use super::feed::AT_POINT_LOCK_OF;
use super::position::{log_end, BinlogPoint, SERVER};
use super::producer::{ASKED_LOCK, FED_LOCK, SERVER_LOCK, WANTED_LOCK};
use super::registry::logged_tables;
use super::stream::{Committed, Transactions};
use super::write::{start_over, Feed, Writer};
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

/// How long the reader's writes wait for a lock on a feed's tables, and how
/// long a database whose tables another session held locked past it is
/// left to its own instances: one locked database does not hold back the
/// feeds of the others.
const LOCK_WAIT: u32 = 2;
const SET_ASIDE: Duration = Duration::from_secs(30);

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
    /// Databases fed by another reader that the server's reader asked for.
    asked: BTreeSet<String>,
    /// Databases whose feed the reader's role may not write.
    barred: BTreeSet<String>,
    /// Databases whose feed tables were locked, until when they are left.
    set_aside: BTreeMap<String, tokio::time::Instant>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(scope: Scope, url: &'a str) -> Self {
        Self {
            scope,
            url,
            asked: BTreeSet::new(),
            barred: BTreeSet::new(),
            set_aside: BTreeMap::new(),
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
            "set session lock_wait_timeout = {LOCK_WAIT}, innodb_lock_wait_timeout = {LOCK_WAIT}"
        )))
        .execute(&mut *connection)
        .await?;
        let mut writer = Writer::new(server);
        match &self.scope {
            Scope::Database(database) => {
                let database = database.clone();
                resume(connection, &mut writer, &database).await?;
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
    /// wants any more. Whether a database taken is behind `boundary`, the
    /// point the stream has reached.
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
        let mut behind = false;
        let mut seen = BTreeSet::new();
        for (database, wanted, fed) in listed {
            seen.insert(database.clone());
            let mine = writer.feeds.contains_key(&database);
            let now = tokio::time::Instant::now();
            self.set_aside.retain(|_, until| *until > now);
            let wanted = wanted == 1
                && !self.barred.contains(&database)
                && !self.set_aside.contains_key(&database);
            if mine {
                if !wanted {
                    tracing::debug!(
                        database,
                        "no instance follows the database any more: its feed stops"
                    );
                    leave(connection, writer, &database).await?;
                }
                continue;
            }
            match (wanted, fed == 1) {
                (true, false) => {
                    let taken: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "select get_lock({FED_LOCK}, 0)"
                    )))
                    .bind(&database)
                    .fetch_one(&mut *connection)
                    .await?;
                    if taken != Some(1) {
                        continue;
                    }
                    if let Err(error) = may_write(connection, &database).await {
                        if !is_denied(&error) {
                            return Err(error.into());
                        }
                        tracing::info!(
                            database,
                            error = %error,
                            "the binary log reader may not write this database's feed: its own instances feed it"
                        );
                        self.barred.insert(database.clone());
                        release(connection, FED_LOCK, &database).await?;
                        continue;
                    }
                    let at = resume(connection, writer, &database).await?;
                    behind |= boundary.is_some_and(|boundary| !at.reaches(boundary));
                    if self.asked.remove(&database) {
                        release(connection, ASKED_LOCK, &database).await?;
                    }
                }
                (true, true) => {
                    if self.asked.insert(database.clone()) {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "select get_lock({ASKED_LOCK}, 0)"
                        )))
                        .bind(&database)
                        .execute(&mut *connection)
                        .await?;
                    }
                }
                (false, _) => {
                    if self.asked.remove(&database) {
                        release(connection, ASKED_LOCK, &database).await?;
                    }
                }
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
                    if matches!(self.scope, Scope::Server) && writer.feeds.len() > 1 =>
                {
                    tracing::warn!(
                        database,
                        "another session holds the database's feed tables locked: the server's binary log reader leaves it to its own instances for now"
                    );
                    leave(connection, writer, &database).await?;
                    self.set_aside
                        .insert(database, tokio::time::Instant::now() + SET_ASIDE);
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
            transactions.set_tables(logged_tables(connection, writer.feeds.keys()).await?);
        }
        Ok(false)
    }

    /// Streams the log from `start` and writes its transactions.
    async fn stream(
        &mut self,
        connection: &mut MySqlConnection,
        writer: &mut Writer,
        start: BinlogPoint,
        stop: &CancellationToken,
    ) -> Result<Streamed, BinlogError> {
        let tables = logged_tables(connection, writer.feeds.keys()).await?;
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

/// Takes `database`'s feed from its progress, or starts it over where the
/// progress is another server's or missing; the point it resumes from.
async fn resume(
    connection: &mut MySqlConnection,
    writer: &mut Writer,
    database: &str,
) -> Result<BinlogPoint, BinlogError> {
    let stored: Option<(String, String, String, i64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select server, epoch, file, pos from {}.bloom_guard_log_progress where id = 1",
            ident(database)
        )))
        .fetch_optional(&mut *connection)
        .await?;
    let feed = match stored {
        Some((server, epoch, file, pos)) if server == writer.server => Feed::at(
            epoch,
            BinlogPoint {
                file,
                pos: pos.try_into().unwrap_or(4),
            },
        ),
        stored => {
            if stored.is_some() {
                tracing::warn!(database, "the binary log is another server's than the feed's progress (a failover, a restore): the feed starts over, every guard rebuilds");
            }
            start_over(connection, &writer.server, database).await?
        }
    };
    let at = feed.written.clone();
    writer.feeds.insert(database.to_owned(), feed);
    Ok(at)
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
        if let Some(marked) = feed.marked {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select release_lock({AT_POINT_LOCK_OF})"
            )))
            .bind(database)
            .bind(marked.sequence().unwrap_or(0))
            .bind(marked.pos)
            .execute(&mut *connection)
            .await?;
        }
    }
    release(connection, FED_LOCK, database).await
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

/// Whether `error` is the server's refusal of a right (on a table, a
/// column, a database).
fn is_denied(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|error| matches!(error.number(), 1044 | 1142 | 1143))
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
