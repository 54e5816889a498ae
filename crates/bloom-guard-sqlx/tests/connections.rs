//! The connections an instance holds besides its pool, as `docs/feed.md`
//! ("Connections and poolers") counts them: per guard a listener and a
//! connection for feed reads, per database one notifier (elected or a
//! candidate), whatever the number of guards.

mod common;

use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::postgres;
use common::{follower, install, spawn, wait_until};
use sqlx::PgPool;

/// This database's connections by `application_name`, besides the test's.
async fn held(pool: &PgPool) -> Vec<(String, i64)> {
    let mut held: Vec<(String, i64)> = sqlx::query_as(
        "select application_name, count(*) from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()
            and application_name like 'bloom%'
          group by 1",
    )
    .fetch_all(pool)
    .await
    .expect("connections");
    held.sort();
    held
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn an_instance_holds_two_connections_per_guard_and_one_per_database(pool: PgPool) {
    install(&pool).await;
    let guards: Vec<BloomGuard> = ["items", "items-by-key", "items-again"]
        .into_iter()
        .map(|name| {
            BloomGuard::builder()
                .name(name)
                .expected_items(1000)
                .build()
        })
        .collect();
    let _running: Vec<_> = guards
        .iter()
        .map(|guard| spawn(follower(guard, &pool)))
        .collect();
    wait_until("ready", Duration::from_secs(10), || {
        guards.iter().all(BloomGuard::is_ready)
    })
    .await;
    // The feed connections open at the first read, the notifier once
    // elected.
    let mut expected = vec![
        (postgres::FEED_APPLICATION_NAME.to_owned(), 3),
        (postgres::LISTENER_APPLICATION_NAME.to_owned(), 3),
        (postgres::NOTIFIER_APPLICATION_NAME.to_owned(), 1),
    ];
    expected.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = held(&pool).await;
        if now == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
