//! A failover to an asynchronous standby that lost commits: the promoted
//! standby starts a new timeline and hands out again the transaction ids
//! (and log positions) of the lost transactions. Instances that keep
//! running across it, behind an address switched to the new primary, must
//! never refuse a key the new primary committed, and protect again soon.
//!
//! A throwaway primary and its standby (`pg_basebackup`) run on free
//! ports; the instances reach them through a proxy the test switches.

mod common;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use common::cluster::{Proxy, Server};
use common::*;
use http::StatusCode;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// The primary and its standby, with replication caught up, and a pool
/// through a proxy pointing at the primary.
async fn primary_and_standby() -> (Server, Server, Proxy, PgPool) {
    let primary = Server::start().await;
    primary
        .exec(
            "create table items (
                 id bigint generated always as identity primary key,
                 key text not null unique,
                 value text not null default '')",
        )
        .await;
    let standby = Server::standby_of(&primary).await;
    let proxy = Proxy::to(primary.port).await;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(proxy.options())
        .await
        .expect("a pool through the proxy");
    (primary, standby, proxy, pool)
}

/// Waits until the standby has replayed everything the primary wrote.
async fn replayed(primary: &Server, standby: &Server) {
    let written: String = primary.scalar("select pg_current_wal_lsn()::text").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let caught_up: bool = standby
            .scalar(&format!("select pg_last_wal_replay_lsn() >= '{written}'"))
            .await;
        if caught_up {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standby never caught up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Inserts `keys` one transaction each.
async fn insert_each(server: &Server, keys: &[String]) {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&server.options())
        .await
        .expect("connect");
    for key in keys {
        sqlx::query("insert into items (key) values ($1)")
            .bind(key)
            .execute(&mut conn)
            .await
            .expect("insert");
    }
}

/// The failover itself, with `guards` following through `proxy`: the
/// standby is cut off, `lost` transactions commit on the primary only
/// (the guards see them), the primary crashes, the standby is promoted and
/// the proxy (if any) switched to it. Then 400 keys commit on the new primary, one
/// transaction each, and each is asked of every guard at once. Returns
/// how many of those answers were refusals.
async fn fail_over(
    primary: &mut Server,
    standby: &Server,
    proxy: Option<&Proxy>,
    guards: &[&BloomGuard],
    lost: usize,
) -> usize {
    replayed(primary, standby).await;
    // Replication cut: the standby keeps serving, and receives nothing.
    standby.exec("alter system set primary_conninfo = ''").await;
    standby.exec("select pg_reload_conf()").await;
    wait_for_scalar(standby, "select count(*) = 0 from pg_stat_wal_receiver").await;

    let lost: Vec<String> = (0..lost).map(|i| format!("lost-{i}")).collect();
    insert_each(primary, &lost).await;
    let lost_refs: Vec<&str> = lost.iter().map(String::as_str).collect();
    for guard in guards {
        wait_until(
            "the lost keys in the guard",
            Duration::from_secs(10),
            || holds_all(guard, &lost_refs),
        )
        .await;
    }

    primary.crash();
    standby.exec("select pg_promote()").await;
    if let Some(proxy) = proxy {
        proxy.switch(standby.port);
    }

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&standby.options())
        .await
        .expect("connect to the new primary");
    let mut refused = 0;
    for i in 0..400 {
        let key = format!("after-{i}");
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&mut conn)
            .await
            .expect("insert on the new primary");
        for guard in guards {
            if status(guard, &key).await == StatusCode::NOT_FOUND {
                refused += 1;
            }
        }
    }
    refused
}

async fn wait_for_scalar(server: &Server, sql: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !server.scalar::<bool>(sql).await {
        assert!(tokio::time::Instant::now() < deadline, "never: {sql}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After the failover: every guard protects again within seconds, holds
/// every key of the new primary, and refuses absent ones.
async fn protects_again(guards: &[&BloomGuard], standby: &Server) {
    let keys: Vec<String> = {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&standby.options())
            .await
            .expect("connect");
        sqlx::query_scalar("select key from items")
            .fetch_all(&mut conn)
            .await
            .expect("keys")
    };
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for guard in guards {
        wait_until("the guard protecting again", Duration::from_secs(5), || {
            guard.stats().state == GuardState::Ready && holds_all(guard, &keys)
        })
        .await;
        let refused = (0..200)
            .filter(|i| !guard.may_contain(format!("never-{i}")))
            .count();
        assert!(refused >= 190, "{refused} of 200 absent keys refused");
    }
}

#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn trigger_feed_a_failover_that_lost_commits_refuses_no_key_of_the_new_primary() {
    let (mut primary, standby, proxy, pool) = primary_and_standby().await;
    install(&pool).await;
    let before: Vec<String> = (0..50).map(|i| format!("before-{i}")).collect();
    insert_each(&primary, &before).await;
    let (one, _one) = followed(&pool).await;
    let (two, _two) = followed(&pool).await;

    let refused = fail_over(&mut primary, &standby, Some(&proxy), &[&one, &two], 450).await;
    assert_eq!(refused, 0, "keys of the new primary refused");
    protects_again(&[&one, &two], &standby).await;
    pool.close().await;
}

#[cfg(feature = "log-feed")]
#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn log_feed_a_failover_that_lost_commits_refuses_no_key_of_the_new_primary() {
    let (mut primary, standby, proxy, pool) = primary_and_standby().await;
    bloom_guard_sqlx::postgres::install(&pool)
        .await
        .expect("install the feed");
    exec(
        &pool,
        "alter table items replica identity using index items_key_key",
    )
    .await;
    items()
        .install_log(&pool)
        .await
        .expect("put items on the log feed");
    let before: Vec<String> = (0..50).map(|i| format!("before-{i}")).collect();
    insert_each(&primary, &before).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);
    let (one, _one) = log::log_followed(&pool, &url).await;
    let (two, _two) = log::log_followed(&pool, &url).await;

    let refused = fail_over(&mut primary, &standby, Some(&proxy), &[&one, &two], 450).await;
    assert_eq!(refused, 0, "keys of the new primary refused");
    protects_again(&[&one, &two], &standby).await;
    pool.close().await;
}

/// A follower given a standby's URL stops at start with the fix named,
/// and its guard lets every request through.
#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn a_follower_on_a_standby_says_so_at_start() {
    let (_primary, standby, _proxy, pool) = primary_and_standby().await;
    install(&pool).await;
    let standby_pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(standby.options())
        .await
        .expect("a pool on the standby");
    // The feed's schema reaches the standby.
    wait_for_scalar(
        &standby,
        "select exists (select from pg_namespace where nspname = 'bloom_guard')",
    )
    .await;
    let guard = guard();
    let _task = spawn(follower(&guard, &standby_pool));
    wait_until("the follower to stop", Duration::from_secs(10), || {
        guard
            .stats()
            .last_error
            .is_some_and(|error| error.contains("a standby"))
    })
    .await;
    assert!(!guard.is_ready());
    assert_eq!(status(&guard, "any").await, StatusCode::OK);
}

/// A URL that lists the standby first and the primary second, asking for
/// a read-write session: the pool and the follower's own connections (the
/// log feed's replication connections among them) reach the primary, and
/// after the failover the promoted standby, with no key of it refused.
async fn several_servers_across_a_failover(log: bool) {
    let (mut primary, standby, _proxy, setup) = primary_and_standby().await;
    if log {
        bloom_guard_sqlx::postgres::install(&setup)
            .await
            .expect("install the feed");
        exec(
            &setup,
            "alter table items replica identity using index items_key_key",
        )
        .await;
        items()
            .install_log(&setup)
            .await
            .expect("put items on the log feed");
    } else {
        install(&setup).await;
    }
    setup.close().await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        standby.port, primary.port
    );
    let servers = bloom_guard_sqlx::postgres::Servers::parse(&url).expect("a URL of two servers");
    let pool = servers
        .pool(
            PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(5)),
        )
        .await;
    assert_eq!(pool.connect_options().get_port(), primary.port);
    let writable: bool = sqlx::query_scalar("select not pg_is_in_recovery()")
        .fetch_one(&pool)
        .await
        .expect("a query");
    assert!(writable);
    let (guard, _running) = if log {
        log::log_followed(&pool, &url).await
    } else {
        followed(&pool).await
    };

    let refused = fail_over(&mut primary, &standby, None, &[&guard], 200).await;
    assert_eq!(refused, 0, "keys of the new primary refused");
    protects_again(&[&guard], &standby).await;
    assert_eq!(pool.connect_options().get_port(), standby.port);
    sqlx::query("insert into items (key) values ('through-the-pool')")
        .execute(&pool)
        .await
        .expect("a write through the pool, on the new primary");
    pool.close().await;
}

#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn a_url_of_several_servers_follows_the_primary_across_a_failover() {
    several_servers_across_a_failover(false).await;
}

#[cfg(feature = "log-feed")]
#[tokio::test]
#[cfg_attr(not(pg_server), ignore = "needs the Postgres server binaries (PG_BIN)")]
async fn the_log_feed_on_a_url_of_several_servers_follows_the_primary_across_a_failover() {
    several_servers_across_a_failover(true).await;
}
