//! A deploy after a bulk load: the instance that ran the migrations
//! published a snapshot of the empty table and stopped; a bulk load then
//! inserted `keys` rows in one statement, without ANALYZE; a new instance
//! starts. How long until it is ready, and until it rejects 99% of absent
//! keys, and how many full scans of the table did that take?

use std::time::{Duration, Instant};

use bloom_guard::{stats::FilterOrigin, BloomGuard};
use bloom_guard_sqlx::{postgres, Watch};
use serde::Serialize;
use sqlx::PgPool;

use crate::services::Database;

/// Absent keys probed at each poll.
const PROBES: usize = 1_000;
/// How often the new instance is polled.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for protection before giving up.
const GIVE_UP: Duration = Duration::from_secs(120);

/// What the new instance did, from its start.
#[derive(Debug, Serialize)]
pub(crate) struct DeployResult {
    keys: u64,
    /// Until `is_ready`.
    ready_seconds: f64,
    /// Until at least 99% of absent keys were rejected.
    protected_seconds: Option<f64>,
    /// Absent keys rejected at the moment it turned ready.
    rejected_at_ready: f64,
    /// Where its first filter came from, and the generation once protected.
    origin: Option<String>,
    generation: u64,
    sub_filters: u32,
    estimated_fpp: f64,
    /// Sequential scans of `items` from the new instance's start to two
    /// seconds after it protected.
    full_scans: i64,
}

fn follower(guard: &BloomGuard, pool: &PgPool) -> postgres::Follower {
    postgres::Follower::new(
        guard.clone(),
        pool.clone(),
        Watch::table("items").key("key"),
    )
}

fn rejected_share(guard: &BloomGuard) -> f64 {
    let rejected = (0..PROBES)
        .filter(|i| !guard.may_contain(format!("absent-{}", fastrand::u64(..) ^ *i as u64)))
        .count();
    rejected as f64 / PROBES as f64
}

async fn seq_scans(pool: &PgPool) -> Result<i64, sqlx::Error> {
    // The statistics reach the shared counters once a backend goes idle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("select pg_stat_clear_snapshot()")
        .execute(pool)
        .await?;
    sqlx::query_scalar("select seq_scan from pg_stat_user_tables where relname = 'items'")
        .fetch_one(pool)
        .await
}

/// Runs the scenario for each of `sizes` and writes `deploy.json`.
pub(crate) async fn compare(
    server_url: &str,
    out: &std::path::Path,
    sizes: &[u64],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut results = Vec::new();
    for &keys in sizes {
        let result = one(server_url, keys).await?;
        println!("{}", serde_json::to_string(&result)?);
        results.push(result);
    }
    std::fs::write(
        out.join("deploy.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;
    Ok(())
}

async fn one(server_url: &str, keys: u64) -> Result<DeployResult, Box<dyn std::error::Error>> {
    let db = Database::create(server_url, "bloom_guard_deploy").await?;
    let pool = db.pool().clone();
    bloom_guard_sqlx::postgres::install(&pool).await?;
    Watch::table("items").key("key").install(&pool).await?;

    // The instance that ran the migrations: the empty table's snapshot.
    let first = BloomGuard::builder().name("items").build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(follower(&first, &pool).run_until(async {
        let _ = stopped.await;
    }));
    first.ready().await;
    while sqlx::query_scalar::<_, i64>("select count(*) from bloom_guard.snapshots")
        .fetch_one(&pool)
        .await?
        == 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    task.await?;

    // The bulk load, without ANALYZE.
    let count = i64::try_from(keys)?;
    sqlx::query("insert into items (key) select 'key-' || g from generate_series(1::bigint, $1) g")
        .bind(count)
        .execute(&pool)
        .await?;
    let before = seq_scans(&pool).await?;

    let guard = BloomGuard::builder().name("items").build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(follower(&guard, &pool).run_until(async {
        let _ = stopped.await;
    }));
    let mut ready = None;
    let mut protected = None;
    while protected.is_none() && started.elapsed() < GIVE_UP {
        if ready.is_none() && guard.is_ready() {
            ready = Some((started.elapsed(), rejected_share(&guard)));
        }
        if ready.is_some() && rejected_share(&guard) >= 0.99 {
            protected = Some(started.elapsed());
        }
        tokio::time::sleep(POLL).await;
    }
    let after = seq_scans(&pool).await?;
    let stats = guard.stats();
    let _ = stop.send(());
    task.await?;
    let (ready_at, rejected_at_ready) = ready.unwrap_or((GIVE_UP, 0.0));
    Ok(DeployResult {
        keys,
        ready_seconds: ready_at.as_secs_f64(),
        protected_seconds: protected.map(|at| at.as_secs_f64()),
        rejected_at_ready,
        origin: stats.origin.map(|o| FilterOrigin::as_str(o).to_owned()),
        generation: stats.generation,
        sub_filters: stats.sub_filters,
        estimated_fpp: stats.estimated_fpp,
        full_scans: after - before,
    })
}
