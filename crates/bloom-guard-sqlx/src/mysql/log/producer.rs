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
//! One reader per server. Every process that follows a table on this
//! feed runs a candidate for its table's database; the candidates of every
//! database of a server elect one reader with the user lock
//! `bloom_guard_binlog_server`, which streams the log once for every
//! database that wants a feed (`reader.rs`). Three user locks per database,
//! on the candidates' connections, say who wants and who writes its feed:
//!
//! - *wanted* (`bloom_guard_binlog_wanted:<md5 of the name>`): held by one
//!   of the database's candidates. The reader feeds only databases someone
//!   follows, so the feed of a database nobody reads does not grow.
//! - *fed* (`bloom_guard_binlog:<md5>`): held by the connection that writes
//!   the database's feed. A producer whose lock is gone can write nothing
//!   more; no two write one feed.
//! - *asked* (`bloom_guard_binlog_asked:<md5>`): the server's reader would
//!   feed a database that another reader feeds.
//!
//! A database the server's reader cannot feed (its role may not write the
//! database's feed tables) stays unfed; after [`UNFED`] one of its own
//! candidates takes it and streams for it alone, and hands it over, once
//! caught up, when the server's reader asks for it.
//!
//! A reader resumes each feed from its progress, which it writes in the
//! transaction of the rows it covers, so no transaction is written twice or
//! skipped. A log it cannot resume (another server's after a failover, a
//! file purged before it was read) starts a new epoch of the feed: every
//! follower rebuilds, none reads past what it missed.

use std::time::Duration;

use sqlx::{Connection as _, MySqlConnection, MySqlPool};
use tokio_util::sync::CancellationToken;

use super::error::BinlogError;
use super::reader::{Reader, Scope, Shunned};
use crate::per_database::{Membership, PerDatabase};

/// The pause before a candidate that failed stands again.
const RETRY: Duration = Duration::from_secs(1);

/// How long the election's statement waits for the server's lock at a
/// time.
const ELECTION: i64 = 2;

/// How long a database stays unfed before one of its own candidates reads
/// for it alone: longer than the server's reader takes to find it
/// (`reader::RESCAN`).
const UNFED: Duration = Duration::from_secs(3);

/// The server's reader: one per server.
pub(super) const SERVER_LOCK: &str = "'bloom_guard_binlog_server'";

/// The lock of the connection that writes the feed of the database named
/// by its parameter.
pub(super) const FED_LOCK: &str = "concat('bloom_guard_binlog:', md5(?))";

/// The lock one candidate of the database named by its parameter holds.
pub(super) const WANTED_LOCK: &str = "concat('bloom_guard_binlog_wanted:', md5(?))";

/// The lock the server's reader holds while it would feed the database
/// named by its parameter, which another reader feeds.
pub(super) const ASKED_LOCK: &str = "concat('bloom_guard_binlog_asked:', md5(?))";

static PRODUCERS: PerDatabase<()> = PerDatabase::new();

/// The process's candidate for `database`, for as long as a membership is
/// held; it streams with `url`.
pub(crate) fn join(database: String, pool: MySqlPool, url: String) -> Membership<()> {
    PRODUCERS.join(database, (), move |stop| {
        tokio::spawn(
            Candidate {
                pool,
                url,
                shunned: Shunned::default(),
            }
            .run(stop),
        )
    })
}

struct Candidate {
    pool: MySqlPool,
    url: String,
    /// What its readers left to other instances, from one to the next.
    shunned: Shunned,
}

impl Candidate {
    async fn run(mut self, stop: CancellationToken) {
        let mut warned: Option<String> = None;
        while !stop.is_cancelled() {
            match self.stand(&stop).await {
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

    /// Stands for the server's reader on a connection of its own (its
    /// locks go with it), and reads until stopped or failed.
    async fn stand(&mut self, stop: &CancellationToken) -> Result<(), BinlogError> {
        let mut connection = MySqlConnection::connect_with(&self.pool.connect_options()).await?;
        let stood = self.candidacy(&mut connection, stop).await;
        let _ = connection.close().await;
        stood
    }

    async fn candidacy(
        &mut self,
        connection: &mut MySqlConnection,
        stop: &CancellationToken,
    ) -> Result<(), BinlogError> {
        // As the catalog spells it: the server's reader names the
        // database's locks from the catalog.
        let database: String = sqlx::query_scalar(
            "select cast(schema_name as char) from information_schema.schemata
              where schema_name = database()",
        )
        .fetch_optional(&mut *connection)
        .await?
        .ok_or_else(|| BinlogError::Url("the URL names no database".to_owned()))?;
        // Wanted (taken unless this connection holds it), the server's
        // reader (waited for), and whether anyone feeds the database.
        let statement = format!(
            "select if(coalesce(is_used_lock({WANTED_LOCK}) = connection_id(), 0), 1, get_lock({WANTED_LOCK}, 0)),
                    get_lock({SERVER_LOCK}, ?),
                    is_used_lock({FED_LOCK}) is null"
        );
        let mut unfed_since: Option<tokio::time::Instant> = None;
        loop {
            let (_, elected, unfed): (Option<i64>, Option<i64>, Option<i64>) = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                look = sqlx::query_as(sqlx::AssertSqlSafe(statement.as_str()))
                    .bind(&database)
                    .bind(&database)
                    .bind(ELECTION)
                    .bind(&database)
                    .fetch_one(&mut *connection) => look?,
            };
            if elected == Some(1) {
                tracing::debug!(database, "elected the server's binary log reader");
                return Reader::new(Scope::Server, &self.url, &database, &mut self.shunned)
                    .read(connection, stop)
                    .await;
            }
            if unfed != Some(1) {
                unfed_since = None;
                continue;
            }
            let since = *unfed_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() < UNFED {
                continue;
            }
            let taken: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "select get_lock({FED_LOCK}, 0)"
            )))
            .bind(&database)
            .fetch_one(&mut *connection)
            .await?;
            if taken == Some(1) {
                tracing::info!(
                    database,
                    "the server's binary log reader does not feed this database: reading for it alone"
                );
                // Until stopped, or handed over to the server's reader.
                Reader::new(
                    Scope::Database(database.clone()),
                    &self.url,
                    &database,
                    &mut self.shunned,
                )
                .read(connection, stop)
                .await?;
                unfed_since = None;
            }
        }
    }
}
