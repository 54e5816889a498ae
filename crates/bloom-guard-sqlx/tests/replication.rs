//! Rows that logical replication applies to a watched table reach the
//! guard: the initial copy, inserts, and updates that change the key. A
//! throwaway publisher cluster runs on 127.0.0.1 with `wal_level=logical`;
//! the test database subscribes to it.

mod common;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use common::cluster::Server as Publisher;
use common::*;
use sqlx::{Connection as _, PgPool};

/// A subscription of the test database, dropped on drop (also when the
/// test fails): a database with a subscription cannot be dropped, and the
/// test harness drops old test databases before every test.
struct Subscription {
    name: String,
    options: sqlx::postgres::PgConnectOptions,
}

impl Subscription {
    async fn create(pool: &PgPool, publisher: &Publisher) -> Self {
        let name = format!("bloom_guard_items_{}", fastrand::u32(..));
        exec(
            pool,
            &format!(
                "create subscription {name}
                     connection 'host=127.0.0.1 port={} user=postgres dbname=postgres'
                     publication bloom_guard_items",
                publisher.port
            ),
        )
        .await;
        Self {
            name,
            options: (*pool.connect_options()).clone(),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let (name, options) = (self.name.clone(), self.options.clone());
        // Its own thread and runtime: drop cannot wait on the test's.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut conn = sqlx::PgConnection::connect_with(&options).await?;
                // Without its slot, in case the publisher is gone.
                for sql in [
                    format!("alter subscription {name} disable"),
                    format!("alter subscription {name} set (slot_name = none)"),
                    format!("drop subscription {name}"),
                ] {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await?;
                }
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop subscription {}: {dropped:?}", self.name);
        }
    }
}

/// Waits until the guard answers (ready, nothing held) and holds `keys`.
async fn served(guard: &BloomGuard, what: &str, keys: &[String]) {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // The check interval (200 ms here) and one rebuild.
    wait_until(what, Duration::from_secs(15), || {
        guard.stats().state == GuardState::Ready && holds_all(guard, &keys)
    })
    .await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(
    not(all(database, pg_server)),
    ignore = "needs Postgres (DATABASE_URL) and the Postgres server binaries (PG_BIN)"
)]
async fn rows_a_subscription_applies_reach_the_guard(pool: PgPool) {
    let publisher = Publisher::start().await;
    publisher
        .exec(
            "create table items (
                 id bigint generated always as identity primary key,
                 key text not null unique,
                 value text not null default '');
             insert into items (key) select 'copied-' || i from generate_series(1, 100) i;
             create publication bloom_guard_items for table items",
        )
        .await;
    install(&pool).await;
    let (guard, _task) = followed(&pool).await;
    assert!(!guard.may_contain("copied-1"));

    let subscription = Subscription::create(&pool, &publisher).await;
    // The initial copy (COPY by the table-sync worker) fires row triggers
    // in the replica role, as the apply worker does.
    let copied: Vec<String> = (1..=100).map(|i| format!("copied-{i}")).collect();
    served(&guard, "the initial copy", &copied).await;
    // Once the subscription is synchronized, later rows must come through
    // the feed, not a rebuild.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let ready: Option<bool> =
            sqlx::query_scalar("select bool_and(srsubstate = 'r') from pg_subscription_rel")
                .fetch_one(&pool)
                .await
                .expect("subscription states");
        if ready == Some(true) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscription never synchronized"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let generation = guard.stats().generation;

    // The apply worker fires row triggers only.
    publisher
        .exec("insert into items (key) select 'applied-' || i from generate_series(1, 50) i")
        .await;
    let applied: Vec<String> = (1..=50).map(|i| format!("applied-{i}")).collect();
    served(&guard, "the applied inserts", &applied).await;
    publisher
        .exec("update items set key = 'renamed-' || key where key in ('applied-1', 'applied-2', 'copied-3')")
        .await;
    let renamed: Vec<String> = ["applied-1", "applied-2", "copied-3"]
        .iter()
        .map(|key| format!("renamed-{key}"))
        .collect();
    served(&guard, "the applied renames", &renamed).await;
    assert!(!guard.may_contain("never-written"));
    assert_eq!(
        guard.stats().generation,
        generation,
        "through the feed, not a rebuild"
    );

    drop(subscription);
    drop(publisher);
}
