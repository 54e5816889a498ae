//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run -p bloom-guard-sqlx --example pg_follower`:
//! a guard kept complete by the change feed, whoever writes the rows.
//!
//! Creates a database of its own (`bloom_guard_example`, dropped at the
//! end), installs the feed, watches a table, and starts a [`postgres::Follower`]:
//! it scans the table once, then reads every key any SQL client commits.
//! A row inserted by plain SQL, as `psql` would, reaches the filter without
//! the application ever calling `guard.insert`.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, Watch};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};

const DATABASE: &str = "bloom_guard_example";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a Postgres server")?;
    let server: PgConnectOptions = url.parse()?;
    let mut admin = server.connect().await?;
    let recreate = format!("drop database if exists {DATABASE} with (force)");
    sqlx::query(sqlx::AssertSqlSafe(recreate.clone()))
        .execute(&mut admin)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("create database {DATABASE}")))
        .execute(&mut admin)
        .await?;
    let pool = PgPool::connect_with(server.database(DATABASE)).await?;

    // The app's table, with some rows, and the feed (once, with the migrations).
    sqlx::raw_sql(
        "create table items (id bigint generated always as identity primary key, key text not null unique);
         insert into items (key) select 'item-' || i from generate_series(1, 10000) i;",
    )
    .execute(&pool)
    .await?;
    let items = Watch::table("items").key("key");
    bloom_guard_sqlx::postgres::install(&pool).await?;
    items.install(&pool).await?;

    let guard = BloomGuard::builder()
        .name("items")
        .expected_items(10_000)
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follower = tokio::spawn(
        postgres::Follower::new(guard.clone(), pool.clone(), items).run_until(async move {
            let _ = stopped.await;
        }),
    );
    guard.ready().await;
    println!(
        "ready: {} keys, from a {}",
        guard.stats().keys,
        guard.stats().origin.map_or("-", |origin| origin.as_str())
    );
    println!(
        "item-42 may exist: {}; no-such-item: {}",
        guard.may_contain("item-42"),
        guard.may_contain("no-such-item")
    );

    // Another client writes a row: the feed brings it to every instance.
    let written = Instant::now();
    sqlx::query("insert into items (key) values ('written-by-psql')")
        .execute(&pool)
        .await?;
    while !guard.may_contain("written-by-psql") {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "a key committed by plain SQL reached the filter in {:?}",
        written.elapsed()
    );

    // This instance in the fleet view: every follower records a heartbeat
    // every 5 s, and within a second of a change (here: ready).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for instance in guard.fleet().await? {
        println!(
            "fleet: {} is {}, mode {}, generation {}",
            instance.id, instance.state, instance.mode, instance.generation
        );
    }

    drop(stop);
    follower.await?;
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(recreate))
        .execute(&mut admin)
        .await?;
    Ok(())
}
