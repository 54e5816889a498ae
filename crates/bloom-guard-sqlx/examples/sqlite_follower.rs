//! `cargo run -p bloom-guard-sqlx --features sqlite --example sqlite_follower`:
//! two instances on one SQLite file see each other's keys, and those of
//! any other SQLite client.
//!
//! Creates a file in the temporary directory (removed at the end), installs
//! the feed's triggers, and starts two guards, each with its own pool and
//! [`sqlite::Follower`], as two processes would. A row inserted through one
//! pool by plain SQL reaches both filters.

#![allow(clippy::print_stdout, reason = "an example reports on stdout")]

use std::str::FromStr;
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{sqlite, Watch};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

async fn open(path: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("bloom-guard-example-{}.db", std::process::id()));
    let first = open(&path).await?;
    sqlx::raw_sql(
        "create table if not exists items (id integer primary key, key text not null unique);
         insert or ignore into items (key) values ('apple'), ('pear');",
    )
    .execute(&first)
    .await?;
    let items = Watch::table("items").key("key");
    items.install(&first).await?;
    let second = open(&path).await?;

    let mut guards = Vec::new();
    let mut stops = Vec::new();
    for (name, pool) in [("first", first.clone()), ("second", second.clone())] {
        let guard = BloomGuard::builder().name("items").build();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let follower = sqlite::Follower::new(guard.clone(), pool, items.clone()).instance_id(name);
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
    let written = Instant::now();
    sqlx::query("insert into items (key) values ('kiwi')")
        .execute(&first)
        .await?;
    while !guards.iter().all(|guard| guard.may_contain("kiwi")) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!("kiwi reached both filters in {:?}", written.elapsed());
    println!(
        "no-such-key may exist: {}",
        guards[1].may_contain("no-such-key")
    );

    for (stop, follower) in stops {
        drop(stop);
        follower.await?;
    }
    first.close().await;
    second.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(())
}
