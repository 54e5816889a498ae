//! The log feed's slot through what happens to slots in production
//! (feature `log-feed`; `DATABASE_URL`'s server with `wal_level=logical`):
//! a fleet down a while resumes from its slot; a slot dropped, lost past
//! `max_slot_wal_keep_size` (so the fleet down keeps no unbounded log), or
//! missing after a restore into another cluster (a failover before
//! Postgres 17 is the same: a server without the slot) is made again, the
//! feed starts over at its start, and every guard rebuilds. Each ends with
//! every key ever seen asked of the guards, compared with the table.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::log::*;
use common::*;
use sqlx::PgPool;

/// The tests that change the server's `max_slot_wal_keep_size` run alone:
/// another test's slot, unread a moment, could be invalidated meanwhile.
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// `items` holding `k0`..`k199`, and those keys.
async fn seeded_items(pool: &PgPool) -> BTreeSet<String> {
    exec(
        pool,
        "insert into items (key) select 'k' || g from generate_series(0, 199) g",
    )
    .await;
    (0..200).map(|i| format!("k{i}")).collect()
}

/// The slot the feed's state belongs to (name and start), as
/// `bloom_guard.log_slot` records it; `none` while it is made.
async fn made(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "select coalesce((select slot || '@' || made::text from bloom_guard.log_slot
                           where state = 'made'), 'none')",
    )
    .fetch_one(pool)
    .await
    .expect("the log feed's slot")
}

/// Drops the database's log feed slot, stopping its reader.
async fn drop_slot(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let dropped = sqlx::raw_sql(
            "select pg_terminate_backend(active_pid) from pg_replication_slots
              where database = current_database() and active_pid is not null;
             select pg_sleep(0.05);
             select pg_drop_replication_slot(slot_name) from pg_replication_slots
              where database = current_database();",
        )
        .execute(pool)
        .await;
        if dropped.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "cannot drop the slot: {dropped:?}"
        );
    }
}

/// Waits until no instance streams the slot.
async fn until_unread(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sqlx::query_scalar::<_, bool>(
        "select coalesce(bool_or(active), false) from pg_replication_slots
          where database = current_database()",
    )
    .fetch_one(pool)
    .await
    .expect("the slot")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot is still read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn random_writes(pool: &PgPool, n: usize, seen: &mut BTreeSet<String>) {
    let mut rng = seeded("BLOOM_GUARD_SOAK_SEED");
    for _ in 0..n {
        random_write(pool, &mut rng, seen).await;
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_fleet_down_a_while_resumes_from_its_slot(pool: PgPool) {
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    let mut seen = seeded_items(&pool).await;
    let (_, task) = log_followed(&pool, &url).await;
    let slot = made(&pool).await;
    drop(task);
    until_unread(&pool).await;
    random_writes(&pool, 150, &mut seen).await;
    let (status, kept): (String, i64) = sqlx::query_as(
        "select wal_status, (pg_current_wal_lsn() - restart_lsn)::int8 from pg_replication_slots
          where database = current_database()",
    )
    .fetch_one(&pool)
    .await
    .expect("the slot");
    assert!(
        kept > 0 && status != "lost",
        "the slot keeps the log while the fleet is down: {status}, {kept} bytes"
    );
    let (guard, _task) = log_followed(&pool, &url).await;
    holds_what_the_table_holds_once_closed("after the fleet was down", &guard, &pool, &seen).await;
    assert_eq!(made(&pool).await, slot, "the slot was made again");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_dropped_slot_is_made_again_and_every_guard_rebuilds(pool: PgPool) {
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    let mut seen = seeded_items(&pool).await;
    let (a, _a) = log_followed(&pool, &url).await;
    let (b, _b) = log_followed(&pool, &url).await;
    let slot = made(&pool).await;
    let generations = (a.stats().generation, b.stats().generation);
    drop_slot(&pool).await;
    random_writes(&pool, 150, &mut seen).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while made(&pool).await == slot {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was not made again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holds_what_the_table_holds_once_closed("a", &a, &pool, &seen).await;
    holds_what_the_table_holds_once_closed("b", &b, &pool, &seen).await;
    assert!(
        a.stats().generation > generations.0 && b.stats().generation > generations.1,
        "the guards did not rebuild: {:?} {:?}",
        a.stats(),
        b.stats()
    );
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_restore_into_another_cluster_starts_the_feed_over(pool: PgPool) {
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    let mut seen = seeded_items(&pool).await;
    exec(&pool, "insert into items (key) values ('restored')").await;
    seen.insert("restored".to_owned());
    let (_, task) = log_followed(&pool, &url).await;
    drop(task);
    // What a restore into another cluster brings: the feed's tables with
    // that cluster's positions, far ahead of this one's log, and a
    // delete of a key this database holds, at a position this log is
    // about to reach; no slot.
    drop_slot(&pool).await;
    exec(
        &pool,
        "update bloom_guard.log_progress set applied = 'FFFF/0';
         update bloom_guard.log_horizon set below = 'FFFF/0';
         insert into bloom_guard.log_changes (lsn, guard, kind, key)
         values (pg_current_wal_lsn() + 300000, 'items', 'd', 'restored')",
    )
    .await;
    random_writes(&pool, 100, &mut seen).await;
    let (guard, _task) = log_followed(&pool, &url).await;
    for i in 0..20 {
        let key = format!("after-{i}");
        exec(&pool, &format!("insert into items (key) values ('{key}')")).await;
        seen.insert(key);
    }
    // The log moves past the other cluster's delete.
    exec(
        &pool,
        "insert into items (key) select 'bulk-' || g from generate_series(1, 5000) g",
    )
    .await;
    holds_what_the_table_holds_once_closed("after the restore", &guard, &pool, &seen).await;
}

/// Resets the server's `max_slot_wal_keep_size` when the test ends, also
/// when it fails.
struct KeepSizeReset {
    url: String,
}

impl Drop for KeepSizeReset {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .args([
                "-qAt",
                "-c",
                "alter system reset max_slot_wal_keep_size",
                "-c",
                "select pg_reload_conf()",
            ])
            .output();
    }
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_fleet_down_past_the_slot_limit_keeps_no_more_log_and_rebuilds(pool: PgPool) {
    let _server = SERVER.write().await;
    let (url, _slot) = log_fed(&pool).await;
    let mut seen = seeded_items(&pool).await;
    let (_, task) = log_followed(&pool, &url).await;
    let slot = made(&pool).await;
    drop(task);
    until_unread(&pool).await;
    let _reset = KeepSizeReset { url: url.clone() };
    exec(&pool, "alter system set max_slot_wal_keep_size = '32MB'").await;
    exec(&pool, "select pg_reload_conf()").await;
    random_writes(&pool, 100, &mut seen).await;
    // The log moves on past the limit while no instance reads the slot.
    exec(&pool, "create table filler (n int)").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for _ in 0..4 {
            exec(&pool, "insert into filler values (1)").await;
            exec(&pool, "select pg_switch_wal()").await;
        }
        exec(&pool, "checkpoint").await;
        let status: String = sqlx::query_scalar(
            "select wal_status from pg_replication_slots where database = current_database()",
        )
        .fetch_one(&pool)
        .await
        .expect("the slot");
        if status == "lost" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot keeps the log past max_slot_wal_keep_size: {status}"
        );
    }
    let (guard, _task) = log_followed(&pool, &url).await;
    holds_what_the_table_holds_once_closed("after the slot was lost", &guard, &pool, &seen).await;
    assert_ne!(made(&pool).await, slot, "the lost slot was not made again");
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_slot_no_producer_moves_fails_the_guards_open_until_it_moves(pool: PgPool) {
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), items(), &url)
            .check_interval(Duration::from_millis(200))
            .stalled_after(Duration::from_secs(1))
    })
    .await;
    // The producer cannot write: its progress row is locked.
    let mut blocker = pool.begin().await.expect("a transaction");
    sqlx::query("select * from bloom_guard.log_progress for update")
        .execute(&mut *blocker)
        .await
        .expect("lock the progress");
    exec(&pool, "insert into items (key) values ('during')").await;
    wait_until("the guard open", Duration::from_secs(10), || {
        guard.stats().state != bloom_guard::stats::GuardState::Ready
    })
    .await;
    assert_ne!(status(&guard, "during").await, http::StatusCode::NOT_FOUND);
    let reason = guard.stats().reason.unwrap_or_default();
    assert!(reason.contains("behind the log"), "{reason}");
    blocker.rollback().await.expect("unlock");
    let seen: BTreeSet<String> = ["during".to_owned()].into();
    holds_what_the_table_holds_once_closed("after the stall", &guard, &pool, &seen).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_slot_made_again_below_a_followers_position_rebuilds_it_at_its_next_read(pool: PgPool) {
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    // No check within the test: the reads alone must see the new slot.
    let (guard, _task) = log_followed_as(|guard| {
        bloom_guard_sqlx::postgres::log::Follower::new(guard, pool.clone(), items(), &url)
            .check_interval(Duration::from_secs(3600))
    })
    .await;
    // The follower's position far ahead of the log, as after a failover
    // that lost the old primary's last log, or a restore in place.
    exec(
        &pool,
        "update bloom_guard.log_progress set applied = 'FFFF/0'",
    )
    .await;
    assert_eq!(
        status(&guard, "never-written").await,
        http::StatusCode::NOT_FOUND
    );
    let slot = made(&pool).await;
    drop_slot(&pool).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while made(&pool).await == slot || made(&pool).await == "none" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was not made again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    exec(&pool, "insert into items (key) values ('after-the-slot')").await;
    let seen: BTreeSet<String> = ["after-the-slot".to_owned()].into();
    holds_what_the_table_holds_once_closed("after the slot", &guard, &pool, &seen).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_guard_warms_up_while_no_producer_streams_and_refuses_nothing_unread(pool: PgPool) {
    use sqlx::Connection as _;
    let _server = SERVER.read().await;
    let (url, _slot) = log_fed(&pool).await;
    // The test holds the producers' election: none streams, as while the
    // first producer of a deploy decodes a bulk load of millions of rows.
    let mut election = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("select pg_advisory_lock(hashtext('bloom_guard.log_producer'))")
        .execute(&mut election)
        .await
        .expect("hold the election");
    exec(&pool, "insert into items (key) values ('before')").await;
    // Warm from a scan without waiting for the producer.
    let (guard, _task) = log_followed(&pool, &url).await;
    assert_ne!(status(&guard, "before").await, http::StatusCode::NOT_FOUND);
    // A key written since: no read reaches it, so no refusal is exact.
    exec(&pool, "insert into items (key) values ('after')").await;
    assert_ne!(status(&guard, "after").await, http::StatusCode::NOT_FOUND);
    election.close().await.expect("let a producer stream");
    let seen: BTreeSet<String> = ["before".to_owned(), "after".to_owned()].into();
    holds_what_the_table_holds_once_closed("once the producer streams", &guard, &pool, &seen).await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_replication_url_that_cannot_feed_the_pools_database_is_named_and_not_retried(
    pool: PgPool,
) {
    use bloom_guard_sqlx::{postgres, FeedError};
    let (url, _slot) = log_fed(&pool).await;
    postgres::log::check_replication(&pool, &url)
        .await
        .expect("the pool's own database");
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let other = format!("{server}/postgres?{query}");
    let setting = |result: Result<(), FeedError>| match result {
        Err(FeedError::ReplicationUrl(message)) => message,
        other => panic!("not a setting's error: {other:?}"),
    };
    // Another database of the cluster: its changes are not the pool's.
    let message = setting(postgres::log::check_replication(&pool, &other).await);
    assert!(message.contains("reaches database postgres"), "{message}");
    // A role without REPLICATION.
    let role = format!("bloom_guard_no_replication_{}", fastrand::u32(..));
    exec(&pool, &format!("create role {role} login")).await;
    let without = url.replacen("://postgres@", &format!("://{role}@"), 1);
    assert_ne!(without, url, "the test's URL names the user postgres");
    let message = setting(postgres::log::check_replication(&pool, &without).await);
    exec(&pool, &format!("drop role {role}")).await;
    assert!(message.contains("42501"), "{message}");
    // A URL the log reader cannot read.
    let message = setting(
        postgres::log::check_replication(&pool, &format!("{base}?sslmode=sometimes")).await,
    );
    assert!(message.contains("sslmode=sometimes"), "{message}");
    // A server that does not answer may answer later: not a setting's.
    let silent =
        postgres::log::check_replication(&pool, "postgres://postgres@127.0.0.1:1/db").await;
    assert!(matches!(silent, Err(FeedError::Database(_))), "{silent:?}");

    // A follower given another database's URL names it and stops: it
    // never scans, streams or refuses.
    let guard = log_guard();
    let _task = spawn(postgres::log::Follower::new(
        guard.clone(),
        pool.clone(),
        items(),
        &*other,
    ));
    wait_until("the error named", Duration::from_secs(20), || {
        guard
            .stats()
            .last_error
            .is_some_and(|error| error.contains("reaches database postgres"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!guard.is_ready());
    let streams: i64 = sqlx::query_scalar(
        "select count(*) from pg_stat_activity where backend_type = 'walsender'
            and datname in (current_database(), 'postgres')",
    )
    .fetch_one(&pool)
    .await
    .expect("walsenders");
    assert_eq!(streams, 0, "a replication connection after the check");
}
