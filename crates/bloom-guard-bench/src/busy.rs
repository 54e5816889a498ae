//! `bloom-load busy`: a flood of absent keys while the server writes, on
//! each feed. Three phases per feed, each a `wrk` flood of `/items/{key}`
//! with absent keys: alone; while writers insert one row per statement
//! into the guarded table; while as many writers insert into a table of
//! another database on the same server. Each phase reports the flood's
//! rate and latency, what the guard refused, passed on and let through
//! because its barrier's read did not come in time, and the writers'
//! rate; the log feed's table phase adds the commit-to-feed lag of the
//! rows written and the producer's catch-up after the writers stop.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use crate::barrier::{ATTACK_LUA, SEEDED_LUA};
use crate::log_twin::catch_up;
use crate::services::{admin_json, Database, Service};
use crate::writers::drive;
use crate::wrk::{tempfile_dir, wrk};

/// What `bloom-load busy` measures.
pub(crate) struct BusySettings {
    pub(crate) keys: u64,
    pub(crate) seconds: u64,
    pub(crate) connections: usize,
    pub(crate) writers: usize,
    /// `triggers`, `log`, or both in turn.
    pub(crate) feeds: Vec<String>,
}

/// One flood.
#[derive(Debug, Serialize)]
struct Row {
    feed: String,
    phase: &'static str,
    connections: usize,
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    refused: u64,
    passed_on: u64,
    barrier_timeouts: u64,
    /// Barrier timeouts as a share of the flood's requests.
    timeout_share: f64,
    /// The writers' statements a second, if any wrote.
    writes_per_sec: Option<f64>,
    /// Commit to feed row, over the rows the writers made (log feed).
    lag_p50_ms: Option<f64>,
    lag_p99_ms: Option<f64>,
    /// The producer's catch-up after the writers stopped, as a share of
    /// their window (log feed).
    catch_up_share: Option<f64>,
}

const ALONE: &str = "flood alone";
const ON_TABLE: &str = "writers on the table";
const ELSEWHERE: &str = "writers on another database";

/// The rest before every flood.
const SETTLE: Duration = Duration::from_secs(3);

/// `bloom-load busy`.
pub(crate) async fn busy(
    server_url: &str,
    binary: &Path,
    out: &Path,
    settings: &BusySettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let scripts = tempfile_dir()?;
    let attack = scripts.join("attack.lua");
    std::fs::write(&attack, format!("{SEEDED_LUA}{ATTACK_LUA}"))?;
    let other = Database::create(server_url, "bloom_guard_busy_other").await?;
    sqlx::raw_sql(
        "create table elsewhere (id bigserial primary key, key text not null unique,
                                 created_at timestamptz not null default now())",
    )
    .execute(other.pool())
    .await?;
    let mut rows = Vec::new();
    for feed in &settings.feeds {
        let db = Database::create(server_url, &format!("bloom_guard_busy_{feed}")).await?;
        let result = floods(&db, &other, binary, &attack, feed, settings).await;
        db.drop_database().await?;
        rows.extend(result?);
    }
    other.drop_database().await?;
    let _ = std::fs::remove_dir_all(scripts);
    report(&rows);
    std::fs::write(out.join("busy.json"), serde_json::to_string_pretty(&rows)?)?;
    println!("wrote {}", out.join("busy.json").display());
    Ok(())
}

/// The three floods against one feed's service.
async fn floods(
    db: &Database,
    other: &Database,
    binary: &Path,
    attack: &Path,
    feed: &str,
    settings: &BusySettings,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    println!("{feed}: filling {} rows", settings.keys);
    db.fill(settings.keys).await?;
    let env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("BLOOM_FEED", feed.to_owned()),
        ("BLOOM_EXPECTED_ITEMS", settings.keys.to_string()),
        ("BLOOM_READ_BARRIER", "on".to_owned()),
        ("BLOOM_AUDIT_RATE", "0".to_owned()),
    ];
    let service = Service::start_with(binary, 3900, &env).await?;
    let connections = u32::try_from(settings.writers + 4)?;
    let pools = [
        PgPoolOptions::new()
            .max_connections(connections)
            .connect(&db.url)
            .await?,
        PgPoolOptions::new()
            .max_connections(connections)
            .connect(&other.url)
            .await?,
    ];
    let next_row = Arc::new(AtomicU64::new(0));
    let window = Duration::from_secs(settings.seconds);
    let mut rows = Vec::new();
    for (run, phase) in [ALONE, ON_TABLE, ELSEWHERE].into_iter().enumerate() {
        tokio::time::sleep(SETTLE).await;
        let before = counts(&service).await?;
        let writing = async {
            let (pool, table) = match phase {
                ON_TABLE => (&pools[0], "items"),
                ELSEWHERE => (&pools[1], "elsewhere"),
                _ => return None,
            };
            let run = 1_000 + run as u64;
            Some(
                drive(
                    pool,
                    table,
                    "insert",
                    settings.writers,
                    window,
                    &next_row,
                    run,
                )
                .await,
            )
        };
        let (measured, writes) = tokio::join!(
            wrk(
                &service.addr,
                attack,
                settings.connections,
                settings.seconds
            ),
            writing
        );
        let (rps, p50, p99) = measured?;
        let after = counts(&service).await?;
        let (mut lag, mut catch_up_share) = ((None, None), None);
        if feed == "log" && writes.is_some() {
            catch_up_share = Some(catch_up(&pools[0]).await?.as_secs_f64() / window.as_secs_f64());
            if phase == ON_TABLE {
                lag = feed_lag(&pools[0], &format!("insert-{}-%", 1_000 + run)).await?;
            }
        }
        println!(
            "{feed:>8} | {phase:<28} | {rps:>8.0} req/s p50 {p50:.2} ms p99 {p99:.2} ms | refused {} passed {} timeouts {}",
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2]
        );
        rows.push(Row {
            feed: feed.to_owned(),
            phase,
            connections: settings.connections,
            requests_per_sec: rps,
            p50_ms: p50,
            p99_ms: p99,
            refused: after[0] - before[0],
            passed_on: after[1] - before[1],
            barrier_timeouts: after[2] - before[2],
            timeout_share: (after[2] - before[2]) as f64 / (rps * window.as_secs_f64()).max(1.0),
            writes_per_sec: writes,
            lag_p50_ms: lag.0,
            lag_p99_ms: lag.1,
            catch_up_share,
        });
    }
    Ok(rows)
}

/// The items guard's refusals, requests passed on, and barrier timeouts
/// so far.
async fn counts(service: &Service) -> Result<[u64; 3], Box<dyn std::error::Error>> {
    let stats = admin_json(&service.admin_addr, "/admin/bloom/items")
        .await
        .ok_or("no stats from the admin API")?;
    let count = |name: &str| {
        stats
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    Ok([
        count("rejected"),
        count("passed"),
        count("barrier_timeouts"),
    ])
}

/// The median and 99th percentile, in milliseconds, of commit (the row's
/// `created_at`, its one-statement transaction's start) to its log feed
/// row, over the rows whose key is `like`.
async fn feed_lag(
    pool: &sqlx::PgPool,
    like: &str,
) -> Result<(Option<f64>, Option<f64>), sqlx::Error> {
    sqlx::query_as(
        "select percentile_cont(0.5) within group (order by lag), percentile_cont(0.99) within group (order by lag)
           from (select extract(epoch from c.written_at - i.created_at)::float8 * 1000 as lag
                   from bloom_guard.log_changes c join items i on i.key = c.key
                  where c.kind = 'i' and i.key like $1) as lags",
    )
    .bind(like)
    .fetch_one(pool)
    .await
}

fn report(rows: &[Row]) {
    println!(
        "\n{:<9} {:<28} {:>9} {:>8} {:>8} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8}",
        "feed",
        "phase",
        "req/s",
        "p50 ms",
        "p99 ms",
        "refused",
        "passed",
        "timeouts",
        "writes/s",
        "lag p50",
        "lag p99",
        "catch-up"
    );
    let opt = |value: Option<f64>, digits: usize| {
        value.map_or("-".to_owned(), |value| format!("{value:.digits$}"))
    };
    for row in rows {
        println!(
            "{:<9} {:<28} {:>9.0} {:>8.2} {:>8.2} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8}",
            row.feed,
            row.phase,
            row.requests_per_sec,
            row.p50_ms,
            row.p99_ms,
            row.refused,
            row.passed_on,
            row.barrier_timeouts,
            opt(row.writes_per_sec, 0),
            opt(row.lag_p50_ms, 1),
            opt(row.lag_p99_ms, 1),
            opt(row.catch_up_share, 2),
        );
    }
    let find = |feed: &str, phase: &str| {
        rows.iter()
            .find(|row| row.feed == feed && row.phase == phase)
    };
    println!("\nratios within this run:");
    for phase in [ALONE, ON_TABLE, ELSEWHERE] {
        if let (Some(log), Some(triggers)) = (find("log", phase), find("triggers", phase)) {
            println!(
                "  {phase:<28}: log ÷ triggers refusals {:.2}, p50 {:.2}, p99 {:.2}",
                log.refused as f64 / (triggers.refused as f64).max(1.0),
                log.p50_ms / triggers.p50_ms,
                log.p99_ms / triggers.p99_ms
            );
        }
    }
    for feed in ["triggers", "log"] {
        if let (Some(alone), Some(elsewhere)) = (find(feed, ALONE), find(feed, ELSEWHERE)) {
            println!(
                "  {feed}: writers on another database ÷ alone {:.2}",
                elsewhere.requests_per_sec / alone.requests_per_sec.max(1.0)
            );
        }
    }
    for row in rows.iter().filter(|row| row.barrier_timeouts > 0) {
        println!(
            "  {} {}: barrier timeouts {:.3}% of requests",
            row.feed,
            row.phase,
            100.0 * row.timeout_share
        );
    }
}
