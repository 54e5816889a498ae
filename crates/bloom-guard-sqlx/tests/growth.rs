//! A guard that starts on an empty Postgres table and follows it through
//! growth and churn keeps its filter: no rescan, deleted keys forgotten,
//! its rate within twice the target.

mod common;

use std::time::Duration;

use bloom_guard::{stats::FilterOrigin, BloomGuard};
use common::*;
use sqlx::PgPool;

const FPP: f64 = 0.01;

/// The share of `keys` the guard lets through.
fn passed(guard: &BloomGuard, keys: impl Iterator<Item = String>) -> f64 {
    let (mut passed, mut all) = (0_u32, 0_u32);
    for key in keys {
        all += 1;
        passed += u32::from(guard.may_contain(&key));
    }
    f64::from(passed) / f64::from(all.max(1))
}

/// Waits until the follower applied `deletes` deletes and holds every key
/// from `row-{from}` to `row-{to}`.
async fn caught_up(guard: &BloomGuard, deletes: u64, from: u32, to: u32) {
    wait_until("the feed's changes", Duration::from_secs(60), || {
        let stats = guard.stats();
        stats.deletes_applied + stats.deletes_left >= deletes
            && (from..to).all(|i| guard.may_contain(format!("row-{i}")))
    })
    .await;
}

#[sqlx::test(migrations = "tests/migrations")]
#[cfg_attr(not(database), ignore = "needs Postgres: set DATABASE_URL")]
async fn a_guard_started_on_an_empty_table_grows_through_churn_without_a_rescan(pool: PgPool) {
    install(&pool).await;
    let guard = BloomGuard::builder().false_positive_rate(FPP).build();
    let _task = spawn(follower(&guard, &pool).snapshot_interval(Duration::from_millis(300)));
    wait_until("ready", Duration::from_secs(20), || guard.is_ready()).await;
    let start = guard.stats();
    exec(
        &pool,
        "insert into items (key) select 'row-' || g from generate_series(0, 49999) g",
    )
    .await;
    caught_up(&guard, 0, 0, 50_000).await;
    // Five rounds: the oldest 10 000 rows deleted, 10 000 new ones added.
    for round in 0..5_u32 {
        let (gone, new) = (round * 10_000, 50_000 + round * 10_000);
        exec(
            &pool,
            &format!(
                "delete from items where key in (select 'row-' || g from generate_series({gone}, {}) g);
                 insert into items (key) select 'row-' || g from generate_series({new}, {}) g",
                gone + 9_999,
                new + 9_999
            ),
        )
        .await;
        caught_up(&guard, u64::from(round + 1) * 10_000, new, new + 10_000).await;
    }
    let stats = guard.stats();
    assert_eq!(stats.generation, start.generation, "a rescan: {stats:?}");
    assert!(stats.sub_filters > 1, "{stats:?}");
    assert!(
        guard.feed().rebuild_due().is_none(),
        "{:?}",
        guard.feed().rebuild_due()
    );
    assert_eq!(
        passed(&guard, (50_000..100_000).map(|i| format!("row-{i}"))),
        1.0
    );
    let deleted = passed(&guard, (0..50_000).map(|i| format!("row-{i}")));
    assert!(deleted <= 2.0 * FPP, "deleted keys passed: {deleted}");
    let never = passed(&guard, (0..100_000).map(|i| format!("never-{i}")));
    assert!(never <= 2.0 * FPP, "never-seen keys passed: {never}");
    // Its snapshot carries every stage (format 4), and a second instance
    // adopts it: one whose position sees the last round of the churn, so
    // the feed since it is nothing to replay (with much to replay, a start
    // may choose a scan). A publish in flight during the last round may
    // commit with a position before it: its successor (the round's 20 000
    // changes are enough to publish again) is awaited.
    let last_round: String = sqlx::query_scalar("select max(xid)::text from bloom_guard.changes")
        .fetch_one(&pool)
        .await
        .expect("the last round's transaction");
    let mut format = 0;
    for _ in 0..200 {
        format = sqlx::query_scalar(
            "select coalesce(max(format), 0) from bloom_guard.snapshots
              where pg_visible_in_snapshot($1::xid8, split_part(position, '/', 2)::pg_snapshot)",
        )
        .bind(&last_round)
        .fetch_one(&pool)
        .await
        .expect("snapshots");
        if format == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if format != 4 {
        let all: Vec<(i64, i32, String, bool)> = sqlx::query_as(
            "select id, format, position, pg_visible_in_snapshot($1::xid8, split_part(position, '/', 2)::pg_snapshot) from bloom_guard.snapshots order by id",
        )
        .bind(&last_round)
        .fetch_all(&pool)
        .await
        .expect("snapshots");
        eprintln!(
            "the last round {last_round}; the snapshots (id, format, position, sees it): {all:?}"
        );
    }
    assert_eq!(format, 4, "no snapshot of the grown filter after the churn");
    let second = BloomGuard::builder().false_positive_rate(FPP).build();
    let _second_task = spawn(follower(&second, &pool));
    wait_until("the second ready", Duration::from_secs(20), || {
        second.is_ready()
    })
    .await;
    assert_eq!(second.stats().origin, Some(FilterOrigin::Snapshot));
    assert_eq!(second.stats().sub_filters, stats.sub_filters);
    assert_eq!(
        passed(&second, (50_000..100_000).map(|i| format!("row-{i}"))),
        1.0
    );
    eprintln!(
        "stages {}, deleted keys passed {deleted}, never-seen {never}, deletes left {}",
        stats.sub_filters, stats.deletes_left
    );
}
