//! The feed's wake-ups, sent from outside the writers' transactions: one
//! instance per database, elected by an advisory lock held on a connection
//! of its own, looks for newly committed changes (every few milliseconds
//! while they come, backing off to once a second when none do) and sends
//! one NOTIFY per batch, in its own transaction. Writers never notify, so
//! their commits never queue behind the lock a NOTIFY takes. When the
//! elected instance dies, its connection closes, the lock is free, and
//! another instance takes over within five seconds and wakes every reader
//! once (what committed after the last look was announced by nobody);
//! meanwhile the readers' interval reads carry on, and the read barrier
//! reads for every refusal.
//!
//! An instance stands once per database, however many of its guards
//! follow it: the followers of one database in a process share one
//! candidate ([`shared`]), which runs while any of them does.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::Connection;
use sqlx::PgPool;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::wake::CHANNEL;
use crate::per_database::{database_key, PerDatabase};

/// The `application_name` of the elected notifier's connection.
pub const NOTIFIER_APPLICATION_NAME: &str = "bloom-guard-notifier";

/// The `application_name` of a candidate's connection, until elected.
const CANDIDATE_APPLICATION_NAME: &str = "bloom-guard-notifier-candidate";

/// How often a candidate tries to be elected: a notifier that died is
/// replaced within this (readers meanwhile read on their interval, and the
/// read barrier reads for refusals).
const CANDIDACY: Duration = Duration::from_secs(5);

/// How soon a candidate whose connection was lost stands again.
const LOST: Duration = Duration::from_secs(1);

/// The longest pause between two looks of an idle notifier.
const IDLE_LOOK: Duration = Duration::from_secs(1);

const ELECT: &str =
    "select pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext('bloom_guard.notifier'))";

/// One round trip: the snapshot now, and a NOTIFY if any change committed
/// between `$1` and it (sent when this statement's transaction commits).
const LOOK: &str = "
with now as (select pg_catalog.pg_current_snapshot() as snapshot),
fresh as (
    select from now
     where exists (select from bloom_guard.changes c
                    where c.xid >= pg_catalog.pg_snapshot_xmin($1::pg_snapshot)
                      and not pg_catalog.pg_visible_in_snapshot(c.xid, $1::pg_snapshot))
),
sent as (select pg_catalog.pg_notify($2, '*') from fresh)
select (select snapshot::text from now), (select pg_catalog.count(*) from sent) > 0";

/// The candidates of this process, by database: one runs for every
/// follower of its database.
static CANDIDATES: PerDatabase<()> = PerDatabase::new();

/// Stands for election for the database of `options` until `stop`,
/// sharing one candidate with every other follower of that database in
/// this process (the first one starts it, with its `every`).
pub(super) async fn shared(pool: PgPool, every: Duration, stop: CancellationToken) {
    let options = pool.connect_options();
    let database = database_key(
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default(),
        options.get_username(),
    );
    let _member = CANDIDATES.join(database, (), |stop| tokio::spawn(run(pool, every, stop)));
    stop.cancelled().await;
}

/// A candidate's connection: READ COMMITTED whatever the database's
/// default, and a look (it finds a handful of rows by the feed's `xid`
/// index) planned as one, whatever the feed's statistics say: never worth
/// parallel workers or JIT compilation, and never a sequential scan. After
/// a bulk load through the triggers, before autovacuum has analyzed the
/// feed, the planner would otherwise guess that a third of its rows match
/// and read all of them at every look (10M rows: 0.7 s of the server's CPU
/// once a second). Startup parameters, no round trip of their own.
fn candidate_options(pool: &PgPool) -> sqlx::postgres::PgConnectOptions {
    super::wake::options(&pool.connect_options())
        .application_name(CANDIDATE_APPLICATION_NAME)
        .options(super::feed::READ_SESSION)
        .options([("enable_seqscan", "off")])
}

/// Stands for election until `stop`; once elected, looks for changes every
/// `every` and wakes the readers.
/// Each connection takes the pool's server of the moment.
async fn run(pool: PgPool, every: Duration, stop: CancellationToken) {
    let mut candidate: Option<PgConnection> = None;
    loop {
        let term = async {
            // One connection for the candidacy and the term: a try costs
            // one query a second, not a new connection.
            let connection = match candidate.as_mut() {
                Some(connection) => connection,
                None => {
                    candidate.insert(PgConnection::connect_with(&candidate_options(&pool)).await?)
                }
            };
            let elected: bool = sqlx::query_scalar(ELECT)
                .fetch_one(&mut *connection)
                .await?;
            if !elected {
                return Ok::<_, sqlx::Error>(());
            }
            sqlx::query("select pg_catalog.set_config('application_name', $1, false)")
                .bind(NOTIFIER_APPLICATION_NAME)
                .execute(&mut *connection)
                .await?;
            tracing::info!("this instance sends the change feed's wake-ups");
            // One wake-up first: what committed after the last notifier's
            // last look (it may have died right after) nobody announced.
            let mut seen: String = sqlx::query_scalar(
                "select pg_catalog.pg_current_snapshot()::text
                   from (select pg_catalog.pg_notify($1, '*')) as woken",
            )
            .bind(CHANNEL)
            .fetch_one(&mut *connection)
            .await?;
            // Every `every` while changes come; after a look that found
            // none, each pause doubles up to `IDLE_LOOK`: an idle database
            // sees about one query a second, and the first write after a
            // quiet spell waits at most that (refusals never wait for it:
            // the read barrier reads the feed itself).
            let mut pause = every;
            loop {
                let (now, found): (String, bool) = sqlx::query_as(LOOK)
                    .bind(&seen)
                    .bind(CHANNEL)
                    .fetch_one(&mut *connection)
                    .await?;
                seen = now;
                pause = if found {
                    every
                } else {
                    (pause * 2).clamp(every, IDLE_LOOK.max(every))
                };
                sleep(pause).await;
            }
        };
        let outcome = tokio::select! {
            () = stop.cancelled() => break,
            outcome = term => outcome,
        };
        // Another instance holds the election: try again in a while. A lost
        // connection (this one's term ended, or the database restarts):
        // stand again soon, so a killed notifier is replaced within a
        // second or so.
        let pause = match outcome {
            Ok(()) => CANDIDACY,
            Err(error) => {
                tracing::debug!(%error, "the change feed's notifier lost its connection; standing again");
                candidate = None;
                LOST
            }
        };
        tokio::select! {
            () = stop.cancelled() => break,
            () = sleep(pause) => {}
        }
    }
    if let Some(connection) = candidate {
        let _ = connection.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The look as the notifier runs it, planned the way Postgres plans a
    /// prepared statement run again and again (custom plans first, then
    /// the generic one): its plan after six runs.
    async fn look_plan(connection: &mut PgConnection, seen: &str) -> String {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "prepare look(text, text) as {LOOK}"
        )))
        .execute(&mut *connection)
        .await
        .expect("prepare the look");
        // A snapshot's text (digits and colons) as a literal: EXECUTE
        // takes no bound parameters.
        let execute = format!("execute look('{seen}', 'bloom_guard_test')");
        for _ in 0..6 {
            sqlx::raw_sql(sqlx::AssertSqlSafe(execute.clone()))
                .execute(&mut *connection)
                .await
                .expect("a look");
        }
        let plan: Vec<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("explain {execute}")))
                .fetch_all(&mut *connection)
                .await
                .expect("the look's plan");
        plan.join("\n")
    }

    #[sqlx::test(migrations = false)]
    #[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
    async fn after_a_bulk_load_a_look_reads_the_feed_by_its_index(pool: PgPool) {
        crate::postgres::install(&pool)
            .await
            .expect("install the feed");
        sqlx::query("create table items (key text primary key)")
            .execute(&pool)
            .await
            .expect("a table");
        crate::watch::Watch::table("items")
            .key("key")
            .install(&pool)
            .await
            .expect("watch");
        // The feed as a bulk load leaves it: a million rows of one
        // transaction, no statistics yet (autovacuum kept away).
        sqlx::raw_sql(
            "alter table bloom_guard.changes_0 set (autovacuum_enabled = false);
             alter table bloom_guard.changes_1 set (autovacuum_enabled = false);
             alter table bloom_guard.changes_2 set (autovacuum_enabled = false);
             insert into bloom_guard.changes (guard, kind, key)
             select 'items', 'i', 'key-' || g from generate_series(1, 1000000) g",
        )
        .execute(&pool)
        .await
        .expect("a bulk load");
        let seen: String = sqlx::query_scalar("select pg_catalog.pg_current_snapshot()::text")
            .fetch_one(&pool)
            .await
            .expect("a snapshot");
        let mut candidate = PgConnection::connect_with(&candidate_options(&pool))
            .await
            .expect("a candidate's connection");
        // A planner that prices every index read far above a sequential
        // one, as it does when it guesses that a third of 10M rows match:
        // the look reads the index anyway.
        sqlx::raw_sql("set random_page_cost = 10000; set cpu_index_tuple_cost = 10")
            .execute(&mut candidate)
            .await
            .expect("planner costs");
        let plan = look_plan(&mut candidate, &seen).await;
        assert!(!plan.contains("Seq Scan on changes"), "{plan}");
        assert!(plan.contains("changes_0_xid_idx"), "{plan}");
    }
}
