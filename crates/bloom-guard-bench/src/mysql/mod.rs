//! `bloom-load mysql`: the MySQL/MariaDB backend's figures, each a ratio
//! or a distribution from one run on one server, for both feeds: the
//! triggers (`items`) and the binary log (`items_log`, when the server
//! writes one in `ROW` format):
//!
//! - writers: 32 connections × {single-row insert, key-changing update,
//!   delete} on each watched table and 32 more on their unwatched twin
//!   `items_plain` at the same time, with each table's follower running
//!   (the next pair waits until the binary log's producer has caught up),
//!   statements per second and their ratio;
//! - propagation: commit on one connection → the key in a follower's
//!   filter (another pool, as another instance), idle and under about
//!   2 000 writes a second, p50 and p99, per feed;
//! - flood: absent keys through the guard's layer (in this process, 64
//!   and 1 024 concurrent requests) while 32 writers insert into the table
//!   (and again while they insert into another database's table), per
//!   feed (the binary log's twice: refusals confirmed by a lookup in the
//!   table, and by a feed read that waits for the producer): refusals a
//!   second, the share of barrier timeouts, and the server's statements
//!   per refusal beyond the writers' own;
//! - catch-up: the binary log feed's producer alone, writing what 32
//!   writers committed while no instance ran (`catchup.rs`);
//! - idle: the statements a second one idle instance costs the server,
//!   per feed, beside none (`idle.rs`);
//! - warm-up: a follower's scan of 1M keys into a guard, against a plain
//!   `SELECT` of the same keys fetched by sqlx, alternating;
//! - deploy: an instance published a snapshot of the empty table and
//!   stopped, a bulk load inserted the keys in one statement, a new
//!   instance starts: until ready, and until it rejects 99% of absent
//!   keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{mysql, Watch};
use serde::Serialize;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{ConnectOptions, Connection, MySqlPool};

mod catchup;
mod flood;
mod idle;
mod propagation;
mod startup;

use propagation::propagation;
use startup::{deploy, warmup};

/// The feeds measured: the triggers' table, and the binary log's where the
/// server writes one in `ROW` format.
const TRIGGERS: (&str, &str) = ("triggers", "items");
const BINLOG: (&str, &str) = ("binlog", "items_log");
/// The binary log's table once more, its refusals waiting for feed reads
/// (the barrier by log point) instead of looking their keys up.
const BINLOG_READ: (&str, &str) = ("binlog, read barrier", "items_log");

#[derive(Debug, Serialize)]
struct Writers {
    feed: &'static str,
    statement: &'static str,
    watched_per_sec: f64,
    unwatched_per_sec: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Propagation {
    feed: &'static str,
    load: &'static str,
    writes_per_sec: f64,
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
    flood: Vec<flood::Flood>,
    catch_up: Option<catchup::CatchUp>,
    idle: Vec<idle::Idle>,
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
    let (pool, url) = database(server_url, "bloom_guard_bench_mysql").await?;
    let feeds: Vec<(&'static str, &'static str)> = if url.is_some() {
        vec![TRIGGERS, BINLOG]
    } else {
        vec![TRIGGERS]
    };
    // Before any instance runs: the producer alone, catching up.
    let catch_up = match url.as_deref() {
        Some(url) if part("catchup") => {
            Some(catchup::catch_up(&pool, url, BINLOG.1, Duration::from_secs(seconds)).await?)
        }
        _ => None,
    };
    let followers = Followers::start(&pool, url.as_deref(), &feeds).await?;
    let server: String = sqlx::query_scalar("select version()")
        .fetch_one(&pool)
        .await?;
    let writers = if part("writers") {
        writers(&pool, &feeds, Duration::from_secs(seconds)).await?
    } else {
        Vec::new()
    };
    let propagation = if part("propagation") {
        propagation(&pool, &followers, samples).await?
    } else {
        Vec::new()
    };
    let flood = if part("flood") {
        let elsewhere = elsewhere(server_url).await?;
        let duration = Duration::from_secs(seconds);
        let mut cells = flood::flood(&pool, &elsewhere, &followers, duration).await?;
        if url.is_some() {
            let reading = Followers::start(&pool, url.as_deref(), &[BINLOG_READ]).await?;
            cells.extend(flood::flood(&pool, &elsewhere, &reading, duration).await?);
        }
        cells
    } else {
        Vec::new()
    };
    drop(followers);
    let idle = if part("idle") {
        idle::idle(
            &pool,
            url.as_deref(),
            &feeds,
            Duration::from_secs(seconds.max(10)),
        )
        .await?
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
        flood,
        catch_up,
        idle,
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

/// Another database on the server, with an unwatched table `elsewhere`
/// for writers beside the guarded tables'.
async fn elsewhere(server_url: &str) -> Result<MySqlPool, Box<dyn std::error::Error>> {
    let pool = MySqlPoolOptions::new()
        .max_connections(40)
        .connect_with(create_database(server_url, "bloom_guard_bench_mysql_elsewhere").await?)
        .await?;
    sqlx::raw_sql(
        "create table elsewhere (id bigint auto_increment primary key,
                                 code varbinary(200) not null, unique key (code))",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

/// A new database `name` on the server: `items` on the triggers,
/// `items_log` on the binary log (if the server's log can feed it: then
/// its URL), and their unwatched twin `items_plain`.
async fn database(
    server_url: &str,
    name: &str,
) -> Result<(MySqlPool, Option<String>), Box<dyn std::error::Error>> {
    let pool = MySqlPoolOptions::new()
        .max_connections(96)
        .connect_with(create_database(server_url, name).await?)
        .await?;
    for table in ["items", "items_log", "items_plain"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "create table {table} (id bigint auto_increment primary key,
                                   code varbinary(200) not null, unique key (code))"
        )))
        .execute(&pool)
        .await?;
    }
    Watch::table("items").key("code").install(&pool).await?;
    let url = match Watch::table("items_log")
        .key("code")
        .install_log(&pool)
        .await
    {
        Ok(()) => {
            let (base, _) = server_url.rsplit_once('/').unwrap_or((server_url, ""));
            Some(format!("{base}/{name}"))
        }
        Err(error) => {
            eprintln!("the binary log feed is not measured: {error}");
            None
        }
    };
    Ok((pool, url))
}

/// A follower of each feed's table, on pools of their own (other
/// instances), running while this is held.
struct Followers {
    guards: Vec<(&'static str, &'static str, BloomGuard)>,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Followers {
    async fn start(
        pool: &MySqlPool,
        url: Option<&str>,
        feeds: &[(&'static str, &'static str)],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let mut guards = Vec::new();
        let mut stops = Vec::new();
        for &(feed, table) in feeds {
            if table == BINLOG.1 && url.is_none() {
                continue;
            }
            let other = MySqlPoolOptions::new()
                .max_connections(8)
                .connect_with((*pool.connect_options()).clone())
                .await?;
            let guard = BloomGuard::builder().expected_items(5_000_000).build();
            let watch = Watch::table(table).key("code");
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let until = async move {
                let _ = stopped.await;
            };
            match url {
                Some(url) if table == BINLOG.1 => {
                    tokio::spawn(
                        mysql::log::Follower::new(guard.clone(), other, watch, url)
                            .look_up_refusals(feed != BINLOG_READ.0)
                            .run_until(until),
                    );
                }
                _ => {
                    tokio::spawn(
                        mysql::Follower::new(guard.clone(), other, watch).run_until(until),
                    );
                }
            }
            while !guard.is_ready() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            guards.push((feed, table, guard));
            stops.push(stop);
        }
        Ok(Self {
            guards,
            _stops: stops,
        })
    }
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
                // A statement counts if it wrote a row: an update or a
                // delete that found none did not.
                if result.is_ok_and(|done| done.rows_affected() > 0) {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    crate::writers::completed_per_sec(duration, &done, &stop, tasks).await
}

async fn writers(
    pool: &MySqlPool,
    feeds: &[(&'static str, &'static str)],
    duration: Duration,
) -> Result<Vec<Writers>, Box<dyn std::error::Error>> {
    // Rows to update and delete: more than the runs take.
    let rows = 1_500_000;
    for (_, table) in feeds {
        fill(pool, table, 1, rows).await?;
    }
    fill(pool, "items_plain", 1, rows).await?;
    let mut cells = Vec::new();
    for statement in ["insert", "update_key", "delete"] {
        // Deletes take rows the key updates did not rename: a delete of a
        // renamed row finds nothing, and costs next to nothing.
        let first = if statement == "delete" {
            rows / 2 + 1
        } else {
            1
        };
        let taken: Vec<Arc<AtomicU64>> = (0..=feeds.len())
            .map(|_| Arc::new(AtomicU64::new(first)))
            .collect();
        let mut watched = vec![0.0; feeds.len()];
        let mut unwatched = vec![0.0; feeds.len()];
        // Each watched table at the same time as the twin, twice: drifts
        // of the machine (the server's flushes, the other processes) hit
        // both alike, which turns on two shared cores cannot promise.
        for _ in 0..2 {
            for (i, (_, table)) in feeds.iter().enumerate() {
                let (table_rate, twin_rate) = tokio::join!(
                    drive(pool, table, statement, duration, &taken[i]),
                    drive(
                        pool,
                        "items_plain",
                        statement,
                        duration,
                        &taken[feeds.len()]
                    ),
                );
                watched[i] += table_rate;
                unwatched[i] += twin_rate;
                // The binary log's producer catches up before the next
                // pair runs, not beside it.
                if *table == BINLOG.1 {
                    catchup::settle(pool).await?;
                }
            }
        }
        for (i, (feed, _)) in feeds.iter().enumerate() {
            let cell = Writers {
                feed,
                statement,
                watched_per_sec: watched[i] / 2.0,
                unwatched_per_sec: unwatched[i] / 2.0,
                ratio: watched[i] / unwatched[i],
            };
            println!("{cell:?}");
            cells.push(cell);
        }
    }
    Ok(cells)
}
