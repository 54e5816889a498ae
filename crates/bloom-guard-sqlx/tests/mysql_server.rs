//! A follower on a server that is not a primary keeps its guard open: a
//! read-only server (a replica, most often) gets its primary's writes
//! late, so a refusal there could miss a key just written.
//!
//! Alone in its test binary: it sets `read_only` on the whole server for
//! a moment, which would hold other tests' guards open.

mod common;

use std::time::Duration;

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::mysql;
use common::mysql::{fresh, items};
use common::{spawn, status, wait_until};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mysql_database), ignore = "needs MySQL or MariaDB: set MYSQL_URL")]
async fn a_read_only_server_holds_the_guard_open() {
    let pool = fresh(8).await;
    let guard = BloomGuard::builder().expected_items(1000).build();
    let _running = spawn(
        mysql::Follower::new(guard.clone(), pool.clone(), items())
            .check_interval(Duration::from_millis(200)),
    );
    wait_until("the warm-up", Duration::from_secs(20), || guard.is_ready()).await;
    assert_eq!(status(&guard, "absent").await, StatusCode::NOT_FOUND);
    sqlx::query("set global read_only = 1")
        .execute(&pool)
        .await
        .expect("read_only on");
    let held = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let stats = guard.stats();
            if stats.state != GuardState::Ready
                && stats
                    .reason
                    .as_deref()
                    .is_some_and(|reason| reason.contains("read-only"))
            {
                return status(&guard, "absent").await;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Back before any assertion: the server is shared.
    sqlx::query("set global read_only = 0")
        .execute(&pool)
        .await
        .expect("read_only off");
    assert_eq!(
        held.expect("held open on a read-only server"),
        StatusCode::OK,
        "refused on a read-only server"
    );
    wait_until("the guard back", Duration::from_secs(10), || {
        guard.stats().state == GuardState::Ready
    })
    .await;
    assert_eq!(status(&guard, "absent").await, StatusCode::NOT_FOUND);
}
