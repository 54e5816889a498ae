//! What the change feed costs the database and how fast it carries keys:
//!
//! - `bloom-load writers`: 1, 8 and 32 concurrent writers × {single-row
//!   insert, 100-row insert, key-changing update, delete}, each against the
//!   watched `items` table and its unwatched twin `items_plain`, the two
//!   alternating, statements per second and their ratio;
//! - `bloom-load propagation`: commit → the key in another instance's
//!   filter, for insert, COPY, key- and id-changing update and upsert, with
//!   the database idle and under 2 000 writes/s from 16 writers;
//! - `bloom-load idle`: the primary's transactions per second from 1 and 8
//!   idle instances (two guards each);
//! - `bloom-load retention`: 2 000 writes/s for a while with a 1-minute
//!   retention, then the feed's size and dead tuples.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, Watch};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::log_twin::{catch_up, log_twin, until_unread};
use crate::services::Database;

/// One cell of the writers' table: the trigger feed's table, the log
/// feed's, and the unwatched twin, with each feed's ratio to the twin.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WriterCell {
    writers: usize,
    statement: &'static str,
    watched_per_sec: f64,
    unwatched_per_sec: f64,
    ratio: f64,
    /// The log feed's table: its writers' rate, and the rate counting
    /// the producer's catch-up after them.
    log_writers_per_sec: Option<f64>,
    /// The twin's rate the log feed's is compared with: the same as
    /// `unwatched_per_sec`, or with `--together` the twin's beside the log
    /// feed's table.
    log_unwatched_per_sec: Option<f64>,
    log_per_sec: Option<f64>,
    log_ratio: Option<f64>,
    /// The log feed's table with no instance streaming the slot while the
    /// writers run (the decoding elsewhere, as on a server with cores to
    /// spare): the writers' rate, and the rate counting the catch-up.
    log_paused_writers_per_sec: Option<f64>,
    log_paused_per_sec: Option<f64>,
    /// With `--together`: the twin beside itself, both runs' rates added,
    /// what a feed's pair (its table's rate and the twin's beside it) is
    /// compared with: the feed's cost to every writer of the server.
    twins_per_sec: Option<f64>,
}

const STATEMENTS: [&str; 4] = ["insert", "insert_100", "update_key", "delete"];

/// A database with the feed installed, `items` watched and `items_plain`
/// its unwatched twin, each holding `rows` rows to update and delete.
pub(crate) async fn feed_database(
    server_url: &str,
    name: &str,
    rows: i64,
) -> Result<(Database, PgPool), Box<dyn std::error::Error>> {
    let db = Database::create(server_url, name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(80)
        .connect(&db.url)
        .await?;
    bloom_guard_sqlx::postgres::install(&pool).await?;
    Watch::table("items").key("key").install(&pool).await?;
    sqlx::raw_sql("create table items_plain (like items including all)")
        .execute(&pool)
        .await?;
    for table in ["items", "items_plain"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "insert into {table} (key) select 'row-' || g from generate_series(1::bigint, $1) g"
        )))
        .bind(rows)
        .execute(&pool)
        .await?;
    }
    sqlx::raw_sql("vacuum analyze").execute(&pool).await?;
    Ok((db, pool))
}

/// Statements per second of `writers` connections running `statement` on
/// `table` for `duration`.
pub(crate) async fn drive(
    pool: &PgPool,
    table: &str,
    statement: &'static str,
    writers: usize,
    duration: Duration,
    next_row: &Arc<AtomicU64>,
    run: u64,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (pool, stop, done, next_row) =
            (pool.clone(), stop.clone(), done.clone(), next_row.clone());
        let table = table.to_owned();
        tasks.push(tokio::spawn(async move {
            let Ok(mut conn) = pool.acquire().await else { return };
            let mut i = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = format!("{statement}-{run}-{writer}-{i}");
                let sql = match statement {
                    "insert" => format!("insert into {table} (key) values ($1) on conflict do nothing"),
                    "insert_100" => format!("insert into {table} (key) select $1 || '-' || g from generate_series(1, 100) g on conflict do nothing"),
                    "update_key" => format!("update {table} set key = $1 where key = 'row-' || $2"),
                    _ => format!("delete from {table} where key = 'row-' || $2"),
                };
                let row = next_row.fetch_add(1, Ordering::Relaxed);
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
    completed_per_sec(duration, &done, &stop, tasks).await
}

/// Lets `tasks` run for `duration`, then stops them (`stop`) and waits for
/// them: the statements they completed (`done`) a second meanwhile.
pub(crate) async fn completed_per_sec(
    duration: Duration,
    done: &AtomicU64,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> f64 {
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    count as f64 / elapsed.as_secs_f64()
}

/// How a cell is measured.
pub(crate) struct Runs {
    /// Seconds per run.
    pub(crate) seconds: u64,
    /// Runs per table and cell.
    pub(crate) rounds: usize,
    /// Each feed's table at the same time as the twin, not in turn.
    pub(crate) together: bool,
}

/// `bloom-load writers`.
pub(crate) async fn compare(
    server_url: &str,
    out: &Path,
    runs: Runs,
    only_writers: &[usize],
    only_statements: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    // Rows to update and delete: more than any cell uses.
    let rows = 3_000_000;
    let (db, pool) = feed_database(server_url, "bloom_guard_writers", rows).await?;
    // The log feed's table, where the server decodes its log: its producer
    // runs (in a follower) while the writers do, as in production, and so
    // does the trigger feed's follower.
    let logged = log_twin(&pool, rows).await?;
    let mut tables = vec!["items", "items_plain"];
    let log_guard = BloomGuard::builder().build();
    let log_follower = || {
        tokio::spawn(
            postgres::log::Follower::new(
                log_guard.clone(),
                pool.clone(),
                Watch::table("items_log").key("key"),
                db.url.clone(),
            )
            .run(),
        )
    };
    let mut log_task = None;
    let _followers = if logged {
        tables.insert(1, "items_log");
        tables.insert(2, "items_log paused");
        log_task = Some(log_follower());
        let items = BloomGuard::builder().build();
        Some(tokio::spawn(
            postgres::Follower::new(items, pool.clone(), Watch::table("items").key("key")).run(),
        ))
    } else {
        println!("the server's wal_level is not logical: the log feed is not measured");
        None
    };
    let duration = Duration::from_secs(runs.seconds);
    let mut cells = Vec::new();
    let mut run = 0;
    // Updates and deletes take each row once: a counter per table.
    let rows_taken: HashMap<&str, Arc<AtomicU64>> = tables
        .iter()
        .map(|&table| (table, Arc::new(AtomicU64::new(1))))
        .collect();
    for writers in [1, 8, 32] {
        if !only_writers.is_empty() && !only_writers.contains(&writers) {
            continue;
        }
        for statement in STATEMENTS {
            if !only_statements.is_empty() && !only_statements.iter().any(|s| s == statement) {
                continue;
            }
            let mut rates: HashMap<&str, Vec<f64>> = HashMap::new();
            for round in 0..runs.rounds.max(1) {
                if runs.together {
                    // Each feed's table beside the twin, the pairs in
                    // turn, the first one alternating.
                    // The twin beside itself too: the pair's total with no
                    // feed, what each feed's pair total is compared with.
                    let mut pairs = vec![
                        ("items", "items", "items_plain beside items"),
                        ("twins", "items_plain", "twins beside"),
                    ];
                    if logged {
                        pairs.push(("items_log", "items_log", "items_plain beside items_log"));
                    }
                    let first = round % pairs.len();
                    pairs.rotate_left(first);
                    for (label, table, twin) in pairs {
                        run += 2;
                        let measured = |table, run| {
                            drive(
                                &pool,
                                table,
                                statement,
                                writers,
                                duration,
                                &rows_taken[table],
                                run,
                            )
                        };
                        let (rate, twin_rate) =
                            tokio::join!(measured(table, run), measured("items_plain", run + 1));
                        rates.entry(label).or_default().push(rate);
                        rates.entry(twin).or_default().push(twin_rate);
                        if table == "items_log" {
                            let drain = catch_up(&pool).await?;
                            rates.entry("items_log caught up").or_default().push(
                                rate * duration.as_secs_f64() / (duration + drain).as_secs_f64(),
                            );
                        }
                    }
                    continue;
                }
                // The tables in turn: drifts of the machine hit all.
                for &table in &tables {
                    run += 1;
                    let paused = table == "items_log paused";
                    if paused {
                        // No instance streams the slot while the writers run.
                        if let Some(task) = log_task.take() {
                            task.abort();
                        }
                        until_unread(&pool).await?;
                    }
                    let rate = drive(
                        &pool,
                        table.trim_end_matches(" paused"),
                        statement,
                        writers,
                        duration,
                        &rows_taken[table.trim_end_matches(" paused")],
                        run,
                    )
                    .await;
                    rates.entry(table).or_default().push(rate);
                    if paused {
                        log_task = Some(log_follower());
                    }
                    // The log feed's work goes on after the writers stop:
                    // the rate with the producer's catch-up counts it.
                    if table.starts_with("items_log") {
                        let drain = catch_up(&pool).await?;
                        let caught_up =
                            rate * duration.as_secs_f64() / (duration + drain).as_secs_f64();
                        rates
                            .entry(if paused {
                                "items_log paused caught up"
                            } else {
                                "items_log caught up"
                            })
                            .or_default()
                            .push(caught_up);
                    }
                }
            }
            let mean = |table| {
                rates
                    .get(table)
                    .map(|rates: &Vec<f64>| rates.iter().sum::<f64>() / rates.len() as f64)
            };
            let twin = |beside| {
                mean("items_plain")
                    .or_else(|| mean(beside))
                    .unwrap_or(f64::NAN)
            };
            let watched = mean("items").unwrap_or(f64::NAN);
            let unwatched = twin("items_plain beside items");
            let log_unwatched = twin("items_plain beside items_log");
            let log_writers = mean("items_log");
            let log = mean("items_log caught up");
            let paused_writers = mean("items_log paused");
            let paused = mean("items_log paused caught up");
            let twins = mean("twins")
                .zip(mean("twins beside"))
                .map(|(one, other)| one + other);
            let cell = WriterCell {
                writers,
                statement,
                watched_per_sec: watched,
                unwatched_per_sec: unwatched,
                ratio: watched / unwatched,
                log_writers_per_sec: log_writers,
                log_unwatched_per_sec: logged.then_some(log_unwatched),
                log_per_sec: log,
                log_ratio: log.map(|log| log / log_unwatched),
                log_paused_writers_per_sec: paused_writers,
                log_paused_per_sec: paused,
                twins_per_sec: twins,
            };
            println!(
                "{writers:>2} writers {statement:<10} triggers {watched:>8.0}/s unwatched {unwatched:>8.0}/s ratio {:.2}{}",
                cell.ratio,
                log.zip(log_writers).map_or(String::new(), |(log, writers)| format!(
                    " | log: writers {writers:>8.0}/s ratio {:.2}, with the catch-up {log:>8.0}/s ratio {:.2}",
                    writers / log_unwatched,
                    log / log_unwatched
                )),
            );
            if let (Some(writers), Some(caught_up)) = (paused_writers, paused) {
                println!(
                    "           the log's reader paused: writers {writers:>8.0}/s ratio {:.2}, with the catch-up {caught_up:>8.0}/s ratio {:.2}",
                    writers / unwatched,
                    caught_up / unwatched
                );
            }
            if let Some(twins) = twins {
                println!(
                    "           pairs ÷ the twins' pair ({twins:>8.0}/s): triggers {:.2}{}",
                    (watched + unwatched) / twins,
                    log_writers.map_or(String::new(), |log| format!(
                        ", log {:.2}",
                        (log + log_unwatched) / twins
                    )),
                );
            }
            cells.push(cell);
        }
    }
    if logged {
        // The slot and the publication go with the feed.
        bloom_guard_sqlx::postgres::uninstall(&pool).await?;
    }
    std::fs::write(out.join("writers.json"), serde_json::to_vec_pretty(&cells)?)?;
    crate::chart::draw_ratios(
        &out.join("writers.svg"),
        &cells
            .iter()
            .map(|c| (format!("{} writers, {}", c.writers, c.statement), c.ratio))
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Transactions per second on the database, over `window`.
pub(crate) async fn transactions_per_sec(
    pool: &PgPool,
    window: Duration,
) -> Result<f64, sqlx::Error> {
    let count = || async {
        sqlx::query_scalar::<_, i64>("select (xact_commit + xact_rollback)::int8 from pg_stat_database where datname = current_database()")
            .fetch_one(pool)
            .await
    };
    let before = count().await?;
    tokio::time::sleep(window).await;
    let after = count().await?;
    // The two counting queries are not the instances'.
    Ok((after - before - 2).max(0) as f64 / window.as_secs_f64())
}
