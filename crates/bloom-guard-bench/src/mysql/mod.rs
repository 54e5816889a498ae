//! `bloom-load mysql`: the MySQL/MariaDB backend's figures, each a ratio
//! or a distribution from one run on one server:
//!
//! - writers: 32 connections × {single-row insert, key-changing update,
//!   delete} on the watched `items` against its unwatched twin
//!   `items_plain`, alternating, statements per second and their ratio;
//! - propagation: commit on one connection → the key in a follower's
//!   filter (another pool, as another instance), idle and under 16
//!   writers, p50 and p99;
//! - warm-up: a follower's scan of 1M keys into a guard, against a plain
//!   `SELECT` of the same keys fetched by sqlx, alternating;
//! - deploy: an instance published a snapshot of the empty table and
//!   stopped, a bulk load inserted the keys in one statement, a new
//!   instance starts: until ready, and until it rejects 99% of absent
//!   keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{mysql, Watch};
use serde::Serialize;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{ConnectOptions, Connection, MySqlPool};

mod startup;

use startup::{deploy, warmup};

#[derive(Debug, Serialize)]
struct Writers {
    statement: &'static str,
    watched_per_sec: f64,
    unwatched_per_sec: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Propagation {
    load: &'static str,
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

#[derive(Debug, Serialize)]
struct Warmup {
    keys: u64,
    follower_secs: f64,
    select_secs: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Deploy {
    keys: u64,
    /// From the new instance's start until `is_ready`.
    ready_secs: f64,
    /// Until at least 99% of absent keys were rejected.
    protected_secs: Option<f64>,
    /// Where its first filter came from, and the generation once
    /// protected.
    origin: Option<String>,
    generation: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    server: String,
    writers: Vec<Writers>,
    propagation: Vec<Propagation>,
    warmup: Option<Warmup>,
    deploy: Option<Deploy>,
}

/// `bloom-load mysql`.
pub(crate) async fn run(
    server_url: &str,
    out: &std::path::Path,
    seconds: u64,
    keys: u64,
    samples: usize,
    parts: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let part = |name: &str| parts.is_empty() || parts.iter().any(|part| part == name);
    let pool = database(server_url, "bloom_guard_bench_mysql").await?;
    let server: String = sqlx::query_scalar("select version()")
        .fetch_one(&pool)
        .await?;
    let writers = if part("writers") {
        writers(&pool, Duration::from_secs(seconds)).await?
    } else {
        Vec::new()
    };
    let propagation = if part("propagation") {
        propagation(&pool, samples).await?
    } else {
        Vec::new()
    };
    let warmup = if part("warmup") {
        Some(warmup(&pool, keys).await?)
    } else {
        None
    };
    let deploy = if part("deploy") {
        Some(deploy(&pool, keys).await?)
    } else {
        None
    };
    let report = Report {
        server,
        writers,
        propagation,
        warmup,
        deploy,
    };
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(out.join("mysql.json"), &json)?;
    println!("{json}");
    Ok(())
}

/// A new, empty database `name` on the server of `server_url` (dropped
/// first if there); the options to connect to it.
pub(crate) async fn create_database(
    server_url: &str,
    name: &str,
) -> Result<sqlx::mysql::MySqlConnectOptions, Box<dyn std::error::Error>> {
    let options: sqlx::mysql::MySqlConnectOptions = server_url.parse()?;
    let mut admin = options.connect().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name}; create database {name}"
    )))
    .execute(&mut admin)
    .await?;
    admin.close().await?;
    Ok(options.database(name))
}

/// A new database `name` on the server, `items` watched and its twin.
async fn database(server_url: &str, name: &str) -> Result<MySqlPool, Box<dyn std::error::Error>> {
    let pool = MySqlPoolOptions::new()
        .max_connections(64)
        .connect_with(create_database(server_url, name).await?)
        .await?;
    for table in ["items", "items_plain"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "create table {table} (id bigint auto_increment primary key,
                                   code varbinary(200) not null, unique key (code))"
        )))
        .execute(&pool)
        .await?;
    }
    Watch::table("items").key("code").install(&pool).await?;
    Ok(pool)
}

/// Inserts `rows` rows `row-1` … into `table`, 10 000 a statement.
async fn fill(pool: &MySqlPool, table: &str, from: u64, rows: u64) -> Result<(), sqlx::Error> {
    let mut next = from;
    while next < from + rows {
        let end = (next + 10_000).min(from + rows);
        let values: Vec<String> = (next..end).map(|i| format!("('row-{i}')")).collect();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "insert into {table} (code) values {}",
            values.join(", ")
        )))
        .execute(pool)
        .await?;
        next = end;
    }
    Ok(())
}

/// Statements per second of 32 connections running `statement` on
/// `table` for `duration`; updates and deletes take rows from `next_row`.
async fn drive(
    pool: &MySqlPool,
    table: &'static str,
    statement: &'static str,
    duration: Duration,
    next_row: &Arc<AtomicU64>,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for writer in 0..32 {
        let (pool, stop, done, next_row) =
            (pool.clone(), stop.clone(), done.clone(), next_row.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut conn) = pool.acquire().await else {
                return;
            };
            let mut i = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let row = next_row.fetch_add(1, Ordering::Relaxed);
                let key = format!("{statement}-{writer}-{i}-{row}");
                let sql = match statement {
                    // Two parameters in every statement, as two are bound.
                    "insert" => format!("insert into {table} (code) values (concat(?, '-', ?))"),
                    "update_key" => {
                        format!("update {table} set code = ? where code = concat('row-', ?)")
                    }
                    _ => format!("delete from {table} where code = ? or code = concat('row-', ?)"),
                };
                let result = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(&key)
                    .bind(row.to_string())
                    .execute(&mut *conn)
                    .await;
                if result.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    crate::writers::completed_per_sec(duration, &done, &stop, tasks).await
}

async fn writers(
    pool: &MySqlPool,
    duration: Duration,
) -> Result<Vec<Writers>, Box<dyn std::error::Error>> {
    // Rows to update and delete: more than the runs take.
    let rows = 1_500_000;
    for table in ["items", "items_plain"] {
        fill(pool, table, 1, rows).await?;
    }
    let mut cells = Vec::new();
    for statement in ["insert", "update_key", "delete"] {
        let taken = [Arc::new(AtomicU64::new(1)), Arc::new(AtomicU64::new(1))];
        let (mut watched, mut unwatched) = (0.0, 0.0);
        // Alternating, twice each: drift hits both alike.
        for _ in 0..2 {
            watched += drive(pool, "items", statement, duration, &taken[0]).await;
            unwatched += drive(pool, "items_plain", statement, duration, &taken[1]).await;
        }
        let cell = Writers {
            statement,
            watched_per_sec: watched / 2.0,
            unwatched_per_sec: unwatched / 2.0,
            ratio: watched / unwatched,
        };
        println!("{cell:?}");
        cells.push(cell);
    }
    Ok(cells)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(index).copied().unwrap_or(f64::NAN)
}

async fn propagation(
    pool: &MySqlPool,
    samples: usize,
) -> Result<Vec<Propagation>, Box<dyn std::error::Error>> {
    // The follower on a pool of its own: another instance.
    let other = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let guard = BloomGuard::builder().expected_items(5_000_000).build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        mysql::Follower::new(guard.clone(), other, Watch::table("items").key("code")).run_until(
            async move {
                let _ = stopped.await;
            },
        ),
    );
    while !guard.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut results = Vec::new();
    for load in ["idle", "16 writers"] {
        let background = Arc::new(AtomicBool::new(load != "idle"));
        let mut tasks = Vec::new();
        if load != "idle" {
            for writer in 0..16 {
                let (pool, running) = (pool.clone(), background.clone());
                tasks.push(tokio::spawn(async move {
                    let mut i = 0_u64;
                    while running.load(Ordering::Relaxed) {
                        i += 1;
                        let _ = sqlx::query("insert into items_plain (code) values (?)")
                            .bind(format!("load-{writer}-{i}"))
                            .execute(&pool)
                            .await;
                        let _ = sqlx::query("insert into items (code) values (?)")
                            .bind(format!("watched-load-{writer}-{i}"))
                            .execute(&pool)
                            .await;
                    }
                }));
            }
        }
        let mut millis = Vec::with_capacity(samples);
        for i in 0..samples {
            let key = format!("propagated-{load}-{i}");
            sqlx::query("insert into items (code) values (?)")
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
        background.store(false, Ordering::Relaxed);
        for task in tasks {
            let _ = task.await;
        }
        millis.sort_by(f64::total_cmp);
        let cell = Propagation {
            load,
            samples,
            p50_ms: percentile(&millis, 0.5),
            p99_ms: percentile(&millis, 0.99),
            max_ms: millis.last().copied().unwrap_or(f64::NAN),
        };
        println!("{cell:?}");
        results.push(cell);
    }
    let _ = stop.send(());
    Ok(results)
}
