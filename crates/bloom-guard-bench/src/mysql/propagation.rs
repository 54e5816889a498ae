//! Commit on one connection to the key in a follower's filter (another
//! pool, as another instance), idle and under about 2 000 writes a second,
//! per feed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use super::{Followers, Propagation};

/// Writes a second of the propagation's load: 16 writers, paced.
const LOAD_WRITES_PER_SEC: f64 = 2_000.0;

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(index).copied().unwrap_or(f64::NAN)
}

pub(super) async fn propagation(
    pool: &MySqlPool,
    followers: &Followers,
    samples: usize,
) -> Result<Vec<Propagation>, Box<dyn std::error::Error>> {
    let mut results = Vec::new();
    for (feed, table, guard) in &followers.guards {
        for load in ["idle", "2000 writes/s"] {
            let background = Arc::new(AtomicBool::new(load != "idle"));
            let written = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            if load != "idle" {
                let pause = Duration::from_secs_f64(16.0 / LOAD_WRITES_PER_SEC);
                for writer in 0..16 {
                    let (pool, running, written) =
                        (pool.clone(), background.clone(), written.clone());
                    let (table, feed) = (*table, *feed);
                    tasks.push(tokio::spawn(async move {
                        let mut ticks = tokio::time::interval(pause);
                        let mut i = 0_u64;
                        while running.load(Ordering::Relaxed) {
                            ticks.tick().await;
                            i += 1;
                            // Half on the watched table, half elsewhere.
                            let target = if i.is_multiple_of(2) {
                                table
                            } else {
                                "items_plain"
                            };
                            let done = sqlx::query(sqlx::AssertSqlSafe(format!(
                                "insert into {target} (code) values (?)"
                            )))
                            .bind(format!("load-{feed}-{writer}-{i}"))
                            .execute(&pool)
                            .await;
                            if done.is_ok() {
                                written.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
            }
            let started = Instant::now();
            let mut millis = Vec::with_capacity(samples);
            for i in 0..samples {
                let key = format!("propagated-{load}-{i}");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "insert into {table} (code) values (?)"
                )))
                .bind(&key)
                .execute(pool)
                .await?;
                let committed = Instant::now();
                while !guard.may_contain(&key) {
                    if committed.elapsed() > Duration::from_secs(10) {
                        return Err(format!("{key} did not arrive in 10 s").into());
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                millis.push(committed.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..25))).await;
            }
            let writes_per_sec =
                written.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
            background.store(false, Ordering::Relaxed);
            for task in tasks {
                let _ = task.await;
            }
            millis.sort_by(f64::total_cmp);
            let cell = Propagation {
                feed,
                load,
                writes_per_sec,
                samples,
                p50_ms: percentile(&millis, 0.5),
                p99_ms: percentile(&millis, 0.99),
                max_ms: millis.last().copied().unwrap_or(f64::NAN),
            };
            println!("{cell:?}");
            results.push(cell);
        }
    }
    Ok(results)
}
