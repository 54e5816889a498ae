//! `bloom-load retention`: 2 000 writes/s for a while with a 1-minute
//! retention, then the feed's size and dead tuples.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, Watch};

use crate::writers::feed_database;

/// `bloom-load retention`.
pub(crate) async fn retention(
    server_url: &str,
    out: &Path,
    minutes: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let (_db, pool) = feed_database(server_url, "bloom_guard_retention", 1000).await?;
    let guard = BloomGuard::builder()
        .name("items")
        .expected_items(10_000_000)
        .build();
    tokio::spawn(
        postgres::Follower::new(
            guard.clone(),
            pool.clone(),
            Watch::table("items").key("key"),
        )
        .retention(Duration::from_secs(60))
        .check_interval(Duration::from_secs(5))
        .run(),
    );
    guard.ready().await;
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for writer in 0..16 {
        let (pool, stop, written) = (pool.clone(), stop.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(8));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                i += 1;
                if sqlx::query("insert into items (key) values ($1)")
                    .bind(format!("r-{writer}-{i}"))
                    .execute(&pool)
                    .await
                    .is_ok()
                {
                    written.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(minutes * 60)).await;
    stop.store(true, Ordering::Relaxed);
    for task in writers {
        let _ = task.await;
    }
    let writes_per_sec = written.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (bytes, rows, dead, deleted): (i64, i64, i64, i64) = sqlx::query_as(
        "select coalesce(sum(pg_total_relation_size(s.relid)), 0)::int8,
                (select count(*) from bloom_guard.changes)::int8,
                coalesce(sum(s.n_dead_tup), 0)::int8, coalesce(sum(s.n_tup_del), 0)::int8
           from pg_stat_user_tables s where s.schemaname = 'bloom_guard' and s.relname like 'changes%'",
    )
    .fetch_one(&pool)
    .await?;
    let guard_keys = guard.stats().keys;
    println!("{minutes} min at {writes_per_sec:.0} writes/s, 1 min retention: feed {:.1} MiB, {rows} rows, {dead} dead tuples, {deleted} row deletes; the guard holds {guard_keys} keys", bytes as f64 / 1048576.0);
    std::fs::write(
        out.join("retention.json"),
        serde_json::to_vec_pretty(&serde_json::json!({
            "minutes": minutes, "writes_per_sec": writes_per_sec, "retention_secs": 60,
            "feed_bytes": bytes, "feed_rows": rows, "n_dead_tup": dead, "n_tup_del": deleted,
        }))?,
    )?;
    Ok(())
}
