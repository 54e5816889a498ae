//! The read barrier on real databases: a key committed through one
//! instance (or any SQL client) and read through another at once is never
//! refused, on Postgres and on SQLite (two pools on one file, as two
//! processes would have).

mod common;

use std::str::FromStr;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{SqliteFollower, Watch};
use common::*;
use http::StatusCode;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::PgPool;

/// Inserts each key through `write` (instance A's write path: its own
/// guard first, then the row) and asks `read` (instance B) at once; the
/// refusals.
async fn refusals<F, Fut>(
    writer: &BloomGuard,
    reader: &BloomGuard,
    rounds: usize,
    write: F,
) -> usize
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut refused = 0;
    for i in 0..rounds {
        let key = format!("created-{i}-{}", fastrand::u32(..));
        writer.insert(&key);
        write(key.clone()).await;
        if status(reader, &key).await == StatusCode::NOT_FOUND {
            refused += 1;
        }
    }
    refused
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_a_key_created_on_one_instance_is_served_by_another_at_once(pool: PgPool) {
    install(&pool).await;
    let (one, _one) = followed(&pool).await;
    let (two, _two) = followed(&pool).await;
    let insert = |key: String| {
        let pool = pool.clone();
        async move {
            sqlx::query("insert into items (key) values ($1)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    assert_eq!(refusals(&one, &two, 300, insert).await, 0);
    let stats = two.stats();
    assert!(
        stats.barrier_found > 0,
        "no key needed the barrier: {stats:?}"
    );
    assert_eq!(status(&two, "never-written").await, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn postgres_without_the_barrier_another_instance_refuses_fresh_keys(pool: PgPool) {
    install(&pool).await;
    let (one, _one) = followed(&pool).await;
    let two = BloomGuard::builder()
        .expected_items(1000)
        .read_barrier(false)
        .build();
    let _two = spawn(follower(&two, &pool));
    wait_until("the second warm-up", Duration::from_secs(10), || {
        two.is_ready()
    })
    .await;
    let insert = |key: String| {
        let pool = pool.clone();
        async move {
            sqlx::query("insert into items (key) values ($1)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    // The window the barrier closes: most keys are refused at once.
    assert!(refusals(&one, &two, 50, insert).await > 25);
}

#[tokio::test]
async fn sqlite_a_key_created_through_one_pool_is_served_through_another_at_once() {
    let dir = std::env::temp_dir().join(format!("bloom-guard-barrier-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("items.db");
    let open = || async {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .expect("options")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .expect("open")
    };
    let (first, second) = (open().await, open().await);
    sqlx::raw_sql("create table items (id integer primary key, key text not null unique)")
        .execute(&first)
        .await
        .expect("schema");
    let items = Watch::table("items").key("key");
    items.install_sqlite(&first).await.expect("install");
    let guards = [BloomGuard::builder().build(), BloomGuard::builder().build()];
    let mut running = Vec::new();
    for (guard, pool) in guards.iter().zip([&first, &second]) {
        let follower = SqliteFollower::new(guard.clone(), pool.clone(), items.clone());
        running.push(tokio::spawn(follower.run()));
    }
    for guard in &guards {
        wait_until("ready", Duration::from_secs(10), || guard.is_ready()).await;
    }
    let insert = |key: String| {
        let pool = first.clone();
        async move {
            sqlx::query("insert into items (key) values (?)")
                .bind(key)
                .execute(&pool)
                .await
                .expect("insert");
        }
    };
    assert_eq!(refusals(&guards[0], &guards[1], 300, insert).await, 0);
    assert_eq!(
        status(&guards[1], "never-written").await,
        StatusCode::NOT_FOUND
    );
    for task in running {
        task.abort();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
