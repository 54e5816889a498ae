//! The binary log feed's producer alone: 32 writers insert one row per
//! statement into the log-fed table while no instance runs, then one
//! instance starts; the transactions a second its producer writes to the
//! feed until its progress reaches the log's end taken when the writers
//! stopped, against the writers' own rate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{mysql, Watch};
use serde::Serialize;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::MySqlPool;

/// Writers while no producer runs.
const WRITERS: usize = 32;

/// The producer's catch-up.
#[derive(Debug, Serialize)]
pub(super) struct CatchUp {
    transactions: u64,
    writers_per_sec: f64,
    /// From the instance's start until its producer's progress reached the
    /// log's end.
    catch_up_secs: f64,
    producer_per_sec: f64,
    /// The producer's rate over the writers'.
    ratio: f64,
    /// The writers' rate again, with the producer running beside them.
    beside_writers_per_sec: f64,
    /// The producer's progress behind the log's end while they write,
    /// sampled every 100 ms, in bytes of the log.
    lag_bytes_p50: i64,
    lag_bytes_max: i64,
    /// From their stop until the producer's progress reached the log's
    /// end.
    drain_secs: f64,
}

/// The log's end as the server reports it: file and offset.
async fn log_end(pool: &MySqlPool) -> Result<(String, i64), sqlx::Error> {
    let row: (String, u64) = sqlx::query_as("show master status").fetch_one(pool).await?;
    Ok((row.0, i64::try_from(row.1).unwrap_or(i64::MAX)))
}

/// The producer's progress behind the log's end, in bytes (one file).
async fn lag(pool: &MySqlPool) -> Result<i64, sqlx::Error> {
    let end = log_end(pool).await?;
    let progress: (String, i64) =
        sqlx::query_as("select file, pos from bloom_guard_log_progress where id = 1")
            .fetch_one(pool)
            .await?;
    Ok(if progress.0 == end.0 {
        end.1 - progress.1
    } else {
        -1
    })
}

/// Waits until the binary log feed's producer has written everything
/// committed so far: the next measure does not run beside its catch-up.
pub(super) async fn settle(pool: &MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
    let target = log_end(pool).await?;
    reached(pool, &target).await
}

/// Waits until the producer's progress reaches `target`.
async fn reached(
    pool: &MySqlPool,
    target: &(String, i64),
) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    loop {
        let progress: Option<(String, i64)> =
            sqlx::query_as("select file, pos from bloom_guard_log_progress where id = 1")
                .fetch_optional(pool)
                .await?;
        if progress.is_some_and(|progress| progress >= *target) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the producer did not catch up in 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 32 writers inserting into `table` for `duration`, `sample` called
/// every 100 ms meanwhile: the rows written and the seconds taken.
async fn write<F, S>(
    pool: &MySqlPool,
    table: &'static str,
    prefix: &'static str,
    duration: Duration,
    sample: S,
) -> (u64, f64)
where
    S: Fn() -> F,
    F: std::future::Future<Output = ()>,
{
    let writers = Inserters::start(pool, table, prefix, WRITERS);
    let started = Instant::now();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sample().await;
    }
    let written = writers.stop().await;
    (written, started.elapsed().as_secs_f64())
}

/// Connections inserting one new row per statement into a table until
/// stopped.
pub(super) struct Inserters {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Inserters {
    /// `count` connections inserting `{prefix}-{writer}-{i}` into `table`.
    pub(super) fn start(pool: &MySqlPool, table: &'static str, prefix: &str, count: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let tasks = (0..count)
            .map(|writer| {
                let (pool, stop, written) = (pool.clone(), stop.clone(), written.clone());
                let prefix = prefix.to_owned();
                tokio::spawn(async move {
                    let mut i = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "insert into {table} (code) values (?)"
                        )))
                        .bind(format!("{prefix}-{writer}-{i}"))
                        .execute(&pool)
                        .await;
                        if done.is_ok() {
                            written.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            written,
            tasks,
        }
    }

    /// Stops them; the rows they inserted.
    pub(super) async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        self.written.load(Ordering::Relaxed)
    }
}

/// Writers on `table` with no instance running, then one instance's
/// producer catching up.
pub(super) async fn catch_up(
    pool: &MySqlPool,
    url: &str,
    table: &'static str,
    duration: Duration,
) -> Result<CatchUp, Box<dyn std::error::Error>> {
    let (transactions, writing) = write(pool, table, "catch-up", duration, || async {}).await;
    let target = log_end(pool).await?;

    let other = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let guard = BloomGuard::builder().expected_items(5_000_000).build();
    let (stop_follower, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    tokio::spawn(
        mysql::log::Follower::new(guard, other, Watch::table(table).key("code"), url).run_until(
            async move {
                let _ = stopped.await;
            },
        ),
    );
    reached(pool, &target).await?;
    let catch_up_secs = started.elapsed().as_secs_f64();
    let writers_per_sec = transactions as f64 / writing;
    let producer_per_sec = transactions as f64 / catch_up_secs;

    // The same writers with the producer running: its lag behind the
    // log's end, sampled, and what is left when they stop.
    let lags = std::sync::Mutex::new(Vec::new());
    let (together, together_secs) = write(pool, table, "beside", duration, || async {
        if let Ok(lag) = lag(pool).await {
            if let Ok(mut lags) = lags.lock() {
                lags.push(lag);
            }
        }
    })
    .await;
    let target = log_end(pool).await?;
    let stopped_at = Instant::now();
    reached(pool, &target).await?;
    let drain_secs = stopped_at.elapsed().as_secs_f64();
    let _ = stop_follower.send(());
    let mut lags = lags.into_inner().unwrap_or_default();
    lags.sort_unstable();
    let cell = CatchUp {
        transactions,
        writers_per_sec,
        catch_up_secs,
        producer_per_sec,
        ratio: producer_per_sec / writers_per_sec,
        beside_writers_per_sec: together as f64 / together_secs,
        lag_bytes_p50: lags.get(lags.len() / 2).copied().unwrap_or(0),
        lag_bytes_max: lags.last().copied().unwrap_or(0),
        drain_secs,
    };
    println!("{cell:?}");
    Ok(cell)
}
