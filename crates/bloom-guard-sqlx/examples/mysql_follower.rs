//! `MYSQL_URL=mysql://root@127.0.0.1:3306/test cargo run -p bloom-guard-sqlx --features mysql --example mysql_follower`:
//! two instances on one MySQL or MariaDB database see each other's keys,
//! those of any other client, and forget deleted ones.
//!
//! Creates the table `bloom_guard_example_items` in the database of
//! `MYSQL_URL` (dropped at the end), installs the feed's triggers, and
//! starts two guards, each with its own pool and [`mysql::Follower`], as two
//! processes would. A row inserted through one pool by plain SQL reaches
//! both filters; a transaction that commits after a later one is not
//! skipped; a deleted row's key is forgotten.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{mysql, Watch};
use sqlx::{Connection, MySqlPool};

async fn reach(guards: &[BloomGuard], key: &str, present: bool) -> Duration {
    let started = Instant::now();
    while !guards.iter().all(|guard| guard.may_contain(key) == present) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let first = MySqlPool::connect(&url).await?;
    sqlx::raw_sql(
        "drop table if exists bloom_guard_example_items;
         create table bloom_guard_example_items (
             id bigint auto_increment primary key,
             code varbinary(200) not null unique);
         insert into bloom_guard_example_items (code) values ('apple'), ('pear');",
    )
    .execute(&first)
    .await?;
    let items = Watch::table("bloom_guard_example_items")
        .key("code")
        .name("example_items");
    items.install(&first).await?;
    let second = MySqlPool::connect(&url).await?;

    let mut guards = Vec::new();
    let mut stops = Vec::new();
    for (name, pool) in [("first", first.clone()), ("second", second.clone())] {
        let guard = BloomGuard::builder().name("example_items").build();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let follower = mysql::Follower::new(guard.clone(), pool, items.clone()).instance_id(name);
        stops.push((
            stop,
            tokio::spawn(follower.run_until(async move {
                let _ = stopped.await;
            })),
        ));
        guard.ready().await;
        println!(
            "{name}: ready with {} keys, from a {}",
            guard.stats().keys,
            guard.stats().origin.map_or("-", |origin| origin.as_str())
        );
        guards.push(guard);
    }

    // A write through the first instance's pool, by plain SQL.
    sqlx::query("insert into bloom_guard_example_items (code) values ('kiwi')")
        .execute(&first)
        .await?;
    println!(
        "kiwi reached both filters in {:?}",
        reach(&guards, "kiwi", true).await
    );

    // A transaction that takes its id first and commits last.
    let mut late = first.acquire().await?;
    let mut transaction = late.begin().await?;
    sqlx::query("insert into bloom_guard_example_items (code) values ('late')")
        .execute(&mut *transaction)
        .await?;
    sqlx::query("insert into bloom_guard_example_items (code) values ('early')")
        .execute(&second)
        .await?;
    reach(&guards, "early", true).await;
    transaction.commit().await?;
    println!(
        "late, committed after a later id was read, arrived in {:?}",
        reach(&guards, "late", true).await
    );

    sqlx::query("delete from bloom_guard_example_items where code = 'pear'")
        .execute(&second)
        .await?;
    println!(
        "pear, deleted, forgotten in {:?}",
        reach(&guards, "pear", false).await
    );
    println!(
        "no-such-key may exist: {}",
        guards[1].may_contain("no-such-key")
    );

    for (stop, follower) in stops {
        drop(stop);
        follower.await?;
    }
    sqlx::raw_sql("drop table bloom_guard_example_items")
        .execute(&first)
        .await?;
    Ok(())
}
