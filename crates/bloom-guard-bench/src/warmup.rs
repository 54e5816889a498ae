//! Warm-up speed and memory: 10M keys through `postgres::CopySource` and
//! `QuerySource`, against `psql`'s `\copy` of the same query; then the cold
//! start of a `postgres::Follower`, first by a scan (which publishes a snapshot),
//! then of a second instance adopting that snapshot.

use std::time::Instant;

use bloom_guard::{stats::FilterOrigin, BloomGuard, KeySource};
use bloom_guard_sqlx::{postgres, QuerySource, Watch};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::services::Database;

const KEY_QUERY: &str = "select key from items";

/// Which source to warm up from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SourceKind {
    /// `postgres::CopySource`.
    Copy,
    /// `postgres::CopySource` with a count hint ten times too low: the filter
    /// grows sub-filters during its one scan.
    Underestimated,
    /// `QuerySource`.
    Query,
    /// A `postgres::Follower` starting on a database without snapshots: it scans
    /// (COPY) and publishes a snapshot.
    Scan,
    /// A `postgres::Follower` starting after `scan`: it adopts the snapshot and
    /// replays the feed since.
    Snapshot,
    /// `scan` with the Bloom filter (`forget_deleted_keys(false)`).
    BloomScan,
    /// `snapshot` with the Bloom filter, adopting `bloom-scan`'s snapshot.
    BloomSnapshot,
}

/// A key written by `psql` between the two followers' starts.
const INSERTED_BETWEEN: &str = "inserted-between-the-starts";

/// One warm-up, as the child process reports it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WarmupResult {
    source: String,
    keys: u64,
    seconds: f64,
    keys_per_sec: f64,
    peak_rss_mib: f64,
    filter_mib: f64,
    /// Where the follower's filter came from.
    #[serde(default)]
    origin: Option<String>,
    /// Whether the snapshot's adopter held the key written between starts.
    #[serde(default)]
    found_inserted_between: Option<bool>,
    #[serde(default)]
    sub_filters: u32,
    #[serde(default)]
    estimated_fpp: f64,
    #[serde(default)]
    generation: u64,
    /// The kind of the filter in use.
    #[serde(default)]
    filter: Option<String>,
    /// The newest published snapshot's length in bytes.
    #[serde(default)]
    snapshot_bytes: Option<i64>,
}

/// Warms a guard up in this process and prints the result as JSON.
pub(crate) async fn one(source: SourceKind, url: &str) -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let pool = PgPool::connect(url).await?;
    let bloom = matches!(source, SourceKind::BloomScan | SourceKind::BloomSnapshot);
    let guard = BloomGuard::builder()
        .name("items")
        .forget_deleted_keys(!bloom)
        .build();
    let mut started = Instant::now();
    let mut snapshot_bytes = None;
    let stats = match source {
        SourceKind::Copy => {
            guard
                .rebuild(&postgres::CopySource::new(pool, KEY_QUERY))
                .await?
        }
        SourceKind::Underestimated => {
            let source = postgres::CopySource::new(pool, KEY_QUERY)
                .count_query("select count(*) / 10 from items");
            // Counted before the clock starts: only the hint is wrong.
            let hint = source.count_hint().await?;
            started = Instant::now();
            guard
                .clone()
                .warm_expecting(source, hint.unwrap_or(0))
                .await;
            guard.stats()
        }
        SourceKind::Query => guard.rebuild(&QuerySource::new(pool, KEY_QUERY)).await?,
        SourceKind::Scan
        | SourceKind::Snapshot
        | SourceKind::BloomScan
        | SourceKind::BloomSnapshot => {
            let watch = Watch::table("items").key("key");
            bloom_guard_sqlx::postgres::install(&pool).await?;
            watch.install(&pool).await?;
            started = Instant::now();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let follower = postgres::Follower::new(guard.clone(), pool.clone(), watch);
            let task = tokio::spawn(follower.run_until(async {
                let _ = stopped.await;
            }));
            guard.ready().await;
            let stats = guard.stats();
            if matches!(source, SourceKind::Scan | SourceKind::BloomScan) {
                // The snapshot the next instance adopts.
                while sqlx::query_scalar::<_, i64>("select count(*) from bloom_guard.snapshots")
                    .fetch_one(&pool)
                    .await?
                    == 0
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                snapshot_bytes = sqlx::query_scalar(
                    "select len from bloom_guard.snapshots order by id desc limit 1",
                )
                .fetch_optional(&pool)
                .await?;
            }
            let _ = stop.send(());
            task.await?;
            stats
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let result = WarmupResult {
        source: format!("{source:?}").to_lowercase(),
        keys: stats.keys,
        seconds,
        keys_per_sec: stats.keys as f64 / seconds,
        peak_rss_mib: peak_rss_mib(),
        filter_mib: stats.bits as f64 / 8.0 / 1024.0 / 1024.0,
        origin: stats
            .origin
            .map(|origin| FilterOrigin::as_str(origin).to_owned()),
        found_inserted_between: matches!(source, SourceKind::Snapshot | SourceKind::BloomSnapshot)
            .then(|| guard.may_contain(INSERTED_BETWEEN)),
        sub_filters: stats.sub_filters,
        estimated_fpp: stats.estimated_fpp,
        generation: stats.generation,
        filter: stats.filter_kind.map(|kind| kind.as_str().to_owned()),
        snapshot_bytes,
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// `VmHWM`: the process's peak resident set.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// Fills a database with `keys` rows, then times psql's `\copy`, the COPY
/// source and the query source, each in a process of its own.
pub(crate) async fn compare(
    server_url: &str,
    keys: u64,
    out: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::create(server_url, "bloom_guard_warmup").await?;
    println!("filling {keys} rows");
    db.fill(keys).await?;
    let _ = db.pool();

    let started = Instant::now();
    let psql = tokio::process::Command::new("psql")
        .arg(&db.url)
        .arg("-qc")
        .arg(format!("\\copy ({KEY_QUERY}) to /dev/null"))
        .status()
        .await?;
    let psql_seconds = started.elapsed().as_secs_f64();
    if !psql.success() {
        return Err("psql \\copy failed".into());
    }
    println!(
        "psql \\copy: {psql_seconds:.2} s ({:.0} keys/s)",
        keys as f64 / psql_seconds
    );

    let me = std::env::current_exe()?;
    let mut results = Vec::new();
    for source in [
        "copy",
        "underestimated",
        "query",
        "bloom-scan",
        "bloom-snapshot",
        "scan",
        "snapshot",
    ] {
        if source == "scan" {
            // The counting filter's instances start over: no Bloom snapshot.
            sqlx::query("delete from bloom_guard.snapshots")
                .execute(db.pool())
                .await?;
        }
        if source.ends_with("snapshot") {
            let inserted = tokio::process::Command::new("psql")
                .arg(&db.url)
                .arg("-qc")
                .arg(format!(
                    "insert into items (key) values ('{INSERTED_BETWEEN}') on conflict do nothing"
                ))
                .status()
                .await?;
            if !inserted.success() {
                return Err("psql insert failed".into());
            }
        }
        let output = tokio::process::Command::new(&me)
            .args(["warmup-one", "--source", source, "--url", &db.url])
            .env("RUST_LOG", "bloom_guard_sqlx=info")
            .output()
            .await?;
        // The follower's own account of where the time went.
        for line in String::from_utf8_lossy(&output.stderr).lines() {
            if line.contains("adopted the filter's snapshot")
                || line.contains("published the filter's snapshot")
            {
                println!("  {line}");
            }
        }
        let result: WarmupResult = serde_json::from_slice(&output.stdout).map_err(|e| {
            format!(
                "warm-up with {source} failed: {e}: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        println!(
            "{source:>8}: {:.3} s ({:.0} keys/s) = {:.2}x psql; peak RSS {:.1} MiB, filter {:.1} MiB, RSS - filter {:.1} MiB",
            result.seconds,
            result.keys_per_sec,
            result.seconds / psql_seconds,
            result.peak_rss_mib,
            result.filter_mib,
            result.peak_rss_mib - result.filter_mib
        );
        println!(
            "  {} filter, generation {}, {} sub-filters, estimated fpp {:.6}, snapshot {:?} bytes",
            result.filter.as_deref().unwrap_or("no"),
            result.generation,
            result.sub_filters,
            result.estimated_fpp,
            result.snapshot_bytes
        );
        if let Some(found) = result.found_inserted_between {
            println!(
                "  origin {:?}; the key psql wrote between the starts is found: {found}",
                result.origin
            );
        }
        results.push(result);
    }
    let report =
        serde_json::json!({ "keys": keys, "psql_copy_seconds": psql_seconds, "sources": results });
    std::fs::write(
        out.join("warmup.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    db.drop_database().await?;
    Ok(())
}
