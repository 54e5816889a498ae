//! `bloom-load propagation`: commit → the key in another instance's
//! filter, for insert, COPY, key- and id-changing update and upsert, with
//! the database idle and under 2 000 writes/s from 16 writers; on the
//! trigger feed (`items`) and, where the server decodes its log, on the
//! log feed (`items_log`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, Watch};

use crate::log_twin::log_twin;
use crate::writers::feed_database;

/// Percentiles of `samples`, in milliseconds.
fn percentiles(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.5), at(0.99), at(1.0))
}

/// `bloom-load propagation`.
pub(crate) async fn propagation(
    server_url: &str,
    out: &Path,
    samples: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (db, pool) =
        feed_database(server_url, "bloom_guard_propagation", samples as i64 * 8).await?;
    let mut feeds = vec![("triggers", "items")];
    if log_twin(&pool, samples as i64 * 8).await? {
        feeds.push(("log", "items_log"));
    } else {
        println!("the server's wal_level is not logical: the log feed is not measured");
    }
    let mut report = Vec::new();
    for (feed, table) in feeds {
        let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let guard = BloomGuard::builder()
            .name(table)
            .expected_items(1_000_000)
            .build();
        let seen = arrived.clone();
        let on_key = move |key: &str| {
            if let Ok(mut seen) = seen.lock() {
                seen.entry(key.to_owned()).or_insert_with(Instant::now);
            }
        };
        let watch = Watch::table(table).key("key");
        let follower = if feed == "log" {
            tokio::spawn(
                postgres::log::Follower::new(guard.clone(), pool.clone(), watch, db.url.clone())
                    .on_key(on_key)
                    .run(),
            )
        } else {
            tokio::spawn(
                postgres::Follower::new(guard.clone(), pool.clone(), watch)
                    .on_key(on_key)
                    .run(),
            )
        };
        guard.ready().await;
        measure(&pool, feed, table, samples, &arrived, &mut report).await?;
        follower.abort();
    }
    std::fs::write(
        out.join("propagation.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    db.drop_database().await?;
    Ok(())
}

/// One feed's samples, idle and under load, appended to `report`.
async fn measure(
    pool: &sqlx::PgPool,
    feed: &str,
    table: &str,
    samples: usize,
    arrived: &Mutex<HashMap<String, Instant>>,
    report: &mut Vec<serde_json::Value>,
) -> Result<(), Box<dyn std::error::Error>> {
    for load in ["idle", "2000 writes/s from 16 writers"] {
        let stop = Arc::new(AtomicBool::new(false));
        let mut background = Vec::new();
        if load != "idle" {
            for writer in 0..16 {
                let (pool, stop, table) = (pool.clone(), stop.clone(), table.to_owned());
                background.push(tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(Duration::from_millis(8));
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        ticks.tick().await;
                        i += 1;
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "insert into {table} (key) values ($1)"
                        )))
                        .bind(format!("load-{writer}-{i}"))
                        .execute(&pool)
                        .await;
                    }
                }));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let mut conn = pool.acquire().await?;
        for kind in ["insert", "copy", "update_key", "update_id", "upsert"] {
            let mut latencies = Vec::with_capacity(samples);
            for i in 0..samples {
                let key = format!("{kind}-{}-{i}", load.len());
                let row = (i + 1) as i64
                    + if load == "idle" {
                        0
                    } else {
                        samples as i64 * 4
                    }
                    + match kind {
                        "update_key" => 0,
                        "update_id" => samples as i64,
                        _ => samples as i64 * 2,
                    };
                match kind {
                    "insert" => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "insert into {table} (key) values ($1)"
                        )))
                        .bind(&key)
                        .execute(&mut *conn)
                        .await?;
                    }
                    "copy" => {
                        let mut copy = conn
                            .copy_in_raw(&format!("copy {table} (key) from stdin"))
                            .await?;
                        copy.send(format!("{key}\n").into_bytes()).await?;
                        copy.finish().await?;
                    }
                    "update_key" => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "update {table} set key = $1 where key = 'row-' || $2"
                        )))
                        .bind(&key)
                        .bind(row.to_string())
                        .execute(&mut *conn)
                        .await?;
                    }
                    "update_id" => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "update {table} set id = default, key = $1 where key = 'row-' || $2"
                        )))
                        .bind(&key)
                        .bind(row.to_string())
                        .execute(&mut *conn)
                        .await?;
                    }
                    _ => {
                        sqlx::query(sqlx::AssertSqlSafe(format!("insert into {table} (key) values ('row-' || $2) on conflict (key) do update set key = $1"))).bind(&key).bind(row.to_string()).execute(&mut *conn).await?;
                    }
                }
                let committed = Instant::now();
                let deadline = committed + Duration::from_secs(5);
                let arrival = loop {
                    if let Some(at) = arrived.lock().ok().and_then(|seen| seen.get(&key).copied()) {
                        break at;
                    }
                    if Instant::now() > deadline {
                        return Err(format!("{key} did not arrive").into());
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                };
                latencies.push(arrival.saturating_duration_since(committed).as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(5..25))).await;
            }
            let (p50, p99, max) = percentiles(&mut latencies);
            println!(
                "{feed:<8} {load:<32} {kind:<10} p50 {p50:>6.1} ms  p99 {p99:>6.1} ms  max {max:>6.1} ms"
            );
            report.push(serde_json::json!({ "feed": feed, "load": load, "write": kind, "p50_ms": p50, "p99_ms": p99, "max_ms": max, "samples": samples }));
        }
        stop.store(true, Ordering::Relaxed);
        for task in background {
            let _ = task.await;
        }
    }
    Ok(())
}
