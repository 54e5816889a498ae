//! A Postgres feed that no instance reads, bounded by the DBA's job:
//! `select bloom_guard.prune(retention)` on a schedule (cron, pg_cron)
//! keeps it within the writes of the last two retentions and two of the
//! job's intervals, however long the application stays down.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use sqlx::PgPool;
use tokio::time::Instant;

const RETENTION: Duration = Duration::from_secs(1);
const JOB_EVERY: Duration = Duration::from_millis(250);

/// A transaction anywhere in the cluster holds every database's pruning
/// back: the long transaction of one test must not overlap the other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_feed_no_instance_reads_stays_within_its_bound_under_the_pruning_job(pool: PgPool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    install(&pool).await;
    // When each transaction that wrote feed rows began writing.
    let written = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<u64, Instant>::new()));
    let until = Instant::now() + RETENTION * 8;
    let writer = {
        let (pool, written) = (pool.clone(), written.clone());
        tokio::spawn(async move {
            let mut n = 0_u64;
            while Instant::now() < until {
                let at = Instant::now();
                let xid: String = sqlx::query_scalar(
                    "insert into items (key) values ($1) returning pg_current_xact_id()::text",
                )
                .bind(format!("k{n}"))
                .fetch_one(&pool)
                .await
                .expect("write");
                let xid = xid.parse().expect("an xid");
                written.lock().expect("written").insert(xid, at);
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        })
    };
    let job = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let retention = format!("{} milliseconds", RETENTION.as_millis());
            while Instant::now() < until {
                sqlx::query("select bloom_guard.prune($1::interval)")
                    .bind(&retention)
                    .execute(&pool)
                    .await
                    .expect("the job");
                tokio::time::sleep(JOB_EVERY).await;
            }
        })
    };
    // The bound: a slot is current for at most a retention and a job's
    // interval, and emptied at most a retention and an interval after.
    let bound = (RETENTION + JOB_EVERY) * 2;
    // A prune that met a look's lock tries again at the next run; a loaded
    // machine runs the job late.
    let slack = Duration::from_millis(1500);
    let mut oldest_seen = Duration::ZERO;
    let mut looks = 0;
    tokio::time::sleep(RETENTION * 3).await;
    while Instant::now() < until {
        let oldest: Option<String> =
            sqlx::query_scalar("select min(xid)::text from bloom_guard.changes")
                .fetch_one(&pool)
                .await
                .expect("the oldest row");
        if let Some(oldest) = oldest {
            let xid: u64 = oldest.parse().expect("an xid");
            // Written at or after the newest write with an xid not above
            // it (a row committed a moment ago may not be noted yet; the
            // watch's own row predates every write).
            let at = written
                .lock()
                .expect("written")
                .range(..=xid)
                .next_back()
                .map_or(started, |(_, at)| *at);
            let age = at.elapsed();
            oldest_seen = oldest_seen.max(age);
            looks += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let writes = writer.await.expect("the writer");
    job.await.expect("the job");
    let rows: i64 = sqlx::query_scalar("select count(*) from bloom_guard.changes")
        .fetch_one(&pool)
        .await
        .expect("count");
    eprintln!("{writes} writes; {rows} rows left; the oldest row seen was {oldest_seen:?} old (bound {bound:?})");
    assert!(looks > 10, "{looks} looks");
    assert!(
        oldest_seen <= bound + slack,
        "a row stayed {oldest_seen:?} (bound {bound:?})"
    );
    assert!((rows as u64) * 2 < writes, "{rows} of {writes} rows left");
}

/// A long transaction holds the feed's pruning back: a follower reports
/// it late (`bloom_guard_feed_prune_overdue_seconds`) with the feed's
/// size, and on time again once the transaction ends.
#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_long_transaction_shows_as_overdue_pruning(pool: PgPool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    install(&pool).await;
    let guard = guard();
    let _task = spawn(follower(&guard, &pool).retention(RETENTION));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    let mut long = pool.begin().await.expect("a transaction");
    sqlx::query("select pg_current_xact_id()")
        .execute(&mut *long)
        .await
        .expect("an xid");
    let storage = || guard.stats().feed.and_then(|feed| feed.storage);
    let overdue = || storage().map_or(0, |storage| storage.prune_overdue_secs);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while overdue() < 2 {
        exec(&pool, &format!("insert into items (key) values ('k{n}')")).await;
        n += 1;
        assert!(Instant::now() < deadline, "never overdue: {:?}", storage());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(storage().is_some_and(|storage| storage.bytes > 0));
    long.commit().await.expect("commit");
    wait_until("on time again", Duration::from_secs(30), || overdue() == 0).await;
}
