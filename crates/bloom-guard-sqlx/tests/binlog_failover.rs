//! A failover of MariaDB to an asynchronous replica that lost commits, on
//! the binary log feed: the promoted replica writes a binary log of its
//! own, whose file names and offsets repeat the old primary's for other
//! transactions, and holds the feed's progress as the old primary wrote
//! it. Instances that keep running across it, behind an address switched
//! to the new primary, must never refuse a key the new primary committed,
//! and protect again soon.
//!
//! A throwaway primary and its replica (`.ci/mariadb`, server ids 1 and 2)
//! run on free ports; the instances reach them through a proxy the test
//! switches.

mod common;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{mysql, Watch};
use common::cluster::Proxy;
use common::mysql::Server;
use common::{spawn, status, wait_until, Running};
use http::StatusCode;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};

fn items() -> Watch {
    Watch::table("items").key("code")
}

/// The primary and its replica, replicating from the primary's log end
/// (by GTID), with database `shop` made on the primary.
fn primary_and_replica() -> (Server, Server) {
    let primary = Server::start_as(false, 1);
    let replica = Server::start_as(false, 2);
    let position = primary.root_value("select @@gtid_binlog_pos");
    replica.root(&format!(
        "set global gtid_slave_pos = '{position}';
         change master to master_host = '127.0.0.1', master_port = {},
                          master_user = 'bloom', master_password = 'bloom',
                          master_use_gtid = slave_pos;
         start slave;",
        primary.port()
    ));
    primary.root(
        "create database shop;
         create table shop.items (id bigint auto_increment primary key,
                                  code varchar(200) collate utf8mb4_nopad_bin not null,
                                  unique key items_code (code));",
    );
    (primary, replica)
}

/// Waits until the replica has applied everything the primary wrote.
fn replayed(primary: &Server, replica: &Server) {
    let written = primary.root_value("select @@gtid_binlog_pos");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let applied = replica.root_value(&format!("select master_gtid_wait('{written}', 0) = 0"));
        if applied == "1" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never caught up with {written}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A guard following `shop.items` through `url`, once warm.
async fn followed(url: &str, look_up: bool) -> (BloomGuard, MySqlPool, Running) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("bloom_guard_sqlx=info")
        .with_test_writer()
        .try_init();
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .expect("a pool through the proxy");
    let guard = BloomGuard::builder()
        .expected_items(20_000)
        .false_positive_rate(0.0001)
        .build();
    let running = spawn(
        mysql::log::Follower::new(guard.clone(), pool.clone(), items(), url)
            .check_interval(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(200))
            .look_up_refusals(look_up),
    );
    wait_until("the warm-up", Duration::from_secs(30), || guard.is_ready()).await;
    (guard, pool, running)
}

async fn insert_each(url: &str, keys: &[String]) {
    let mut connection = MySqlConnection::connect(url).await.expect("connect");
    for key in keys {
        sqlx::query("insert into items (code) values (?)")
            .bind(key)
            .execute(&mut connection)
            .await
            .expect("insert");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(mariadb_server),
    ignore = "needs MariaDB's server (mariadbd) for a primary and a replica of the test's own"
)]
async fn a_failover_that_lost_commits_refuses_no_key_of_the_new_primary() {
    let (primary, replica) = primary_and_replica();
    let proxy = Proxy::to(primary.port()).await;
    let url = format!("mysql://bloom:bloom@127.0.0.1:{}/shop", proxy.port);
    {
        let setup = MySqlPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .expect("connect");
        sqlx::raw_sql("insert into items (code) values ('before-1'), ('before-2'), ('before-3')")
            .execute(&setup)
            .await
            .expect("the first keys");
        items().install_log(&setup).await.expect("install_log");
        setup.close().await;
    }
    // Two instances: one confirms refusals in the table, one by a read of
    // the feed at the log's position.
    let (one, _pool_one, _running_one) = followed(&url, true).await;
    let (two, _pool_two, _running_two) = followed(&url, false).await;
    replayed(&primary, &replica);

    // Replication cut: the replica keeps serving, and receives nothing.
    replica.root("stop slave");
    let lost: Vec<String> = (0..300).map(|i| format!("lost-{i}")).collect();
    insert_each(&primary.url_of("bloom", "shop"), &lost).await;
    for guard in [&one, &two] {
        wait_until(
            "the lost keys in the guard",
            Duration::from_secs(10),
            || lost.iter().all(|key| guard.may_contain(key)),
        )
        .await;
    }
    // The primary crashes; the replica is promoted; the address moves.
    primary.crash();
    replica.root("reset slave all");
    proxy.switch(replica.port());

    // Each key the new primary commits, asked of every instance at once.
    let new_primary = replica.url_of("bloom", "shop");
    let mut connection = MySqlConnection::connect(&new_primary)
        .await
        .expect("connect to the new primary");
    let mut refused = Vec::new();
    for i in 0..400 {
        let key = format!("after-{i}");
        sqlx::query("insert into items (code) values (?)")
            .bind(&key)
            .execute(&mut connection)
            .await
            .expect("insert on the new primary");
        for (name, guard) in [("lookups", &one), ("read barrier", &two)] {
            if status(guard, &key).await == StatusCode::NOT_FOUND {
                refused.push(format!("{key} by {name}"));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "keys the new primary committed were refused: {refused:?}"
    );

    // Both protect again, with every key of the new primary.
    let keys: Vec<String> = sqlx::query_scalar("select code from items")
        .fetch_all(&mut connection)
        .await
        .expect("the new primary's keys");
    assert!(keys.contains(&"before-2".to_owned()) && keys.contains(&"after-399".to_owned()));
    for guard in [&one, &two] {
        wait_until(
            "the guard protecting again",
            Duration::from_secs(20),
            || {
                guard.stats().state == GuardState::Ready
                    && keys.iter().all(|key| guard.may_contain(key))
            },
        )
        .await;
        let mut absent_refused = 0;
        for i in 0..50 {
            if status(guard, &format!("never-{i}")).await == StatusCode::NOT_FOUND {
                absent_refused += 1;
            }
        }
        assert!(
            absent_refused >= 48,
            "{absent_refused} of 50 absent keys refused"
        );
    }
    // The feed started over on the new primary: its progress names it.
    let server: String = sqlx::query_scalar("select server from bloom_guard_log_progress")
        .fetch_one(&mut connection)
        .await
        .expect("the feed's progress");
    assert!(server.starts_with("2:"), "the progress names {server}");
}
