//! A follower whose feed reads go to a hot standby: it protects, and a
//! replica that has not replayed what the primary committed before a
//! request never makes the guard refuse it. A throwaway primary and its
//! streaming standby (`pg_basebackup`) run on free ports.

mod common;

use std::time::Duration;

use bloom_guard_sqlx::postgres;
use common::cluster::Server;
use common::*;
use http::StatusCode;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

async fn pool_of(server: &Server) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(server.options())
        .await
        .expect("a pool")
}

#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn reads_on_a_replica_refuse_no_key_the_primary_committed_before_the_request() {
    let primary = Server::start().await;
    primary
        .exec("create table items (id bigint generated always as identity primary key, key text not null unique)")
        .await;
    let standby = Server::standby_of(&primary).await;
    let pool = pool_of(&primary).await;
    let replica = pool_of(&standby).await;
    install(&pool).await;
    exec(
        &pool,
        "insert into items (key) select 'stored-' || i from generate_series(1, 100) i",
    )
    .await;

    let guard = guard();
    let _running = spawn(
        postgres::Follower::new(guard.clone(), pool.clone(), items())
            .replica(replica.clone())
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(500)),
    );
    wait_until("ready", Duration::from_secs(15), || guard.is_ready()).await;
    let absent = 200;
    let mut refused = 0;
    for i in 0..absent {
        if status(&guard, &format!("absent-{i}")).await == StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    assert!(
        refused * 100 >= absent * 95,
        "{refused} of {absent} refused"
    );
    // The reads went to the replica.
    let reading: i64 = standby
        .scalar(&format!(
            "select count(*) from pg_stat_activity where application_name = '{}'",
            postgres::FEED_APPLICATION_NAME
        ))
        .await;
    assert_eq!(reading, 1, "no feed connection on the replica");

    // Replay paused: the replica holds none of what the primary commits
    // now, and the guard refuses none of it.
    standby.exec("select pg_wal_replay_pause()").await;
    let mut wrongly_refused = Vec::new();
    for i in 0..100 {
        let key = format!("fresh-{i}");
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&pool)
            .await
            .expect("insert on the primary");
        if status(&guard, &key).await == StatusCode::NOT_FOUND {
            wrongly_refused.push(key);
        }
    }
    assert!(wrongly_refused.is_empty(), "refused: {wrongly_refused:?}");
    let on_replica: i64 = standby
        .scalar("select count(*) from items where key like 'fresh-%'")
        .await;
    assert_eq!(on_replica, 0, "the replica replayed while paused");

    // Replay resumed: the reads go back to the replica, and refuse again.
    standby.exec("select pg_wal_replay_resume()").await;
    wait_until("refusals again", Duration::from_secs(10), || {
        !guard.may_contain("absent-after")
    })
    .await;
    assert_eq!(status(&guard, "absent-after").await, StatusCode::NOT_FOUND);
    assert_eq!(status(&guard, "fresh-7").await, StatusCode::OK);
    pool.close().await;
    replica.close().await;
}
