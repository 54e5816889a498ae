//! Warm-up speed and memory: 10M keys through `PgCopySource` and
//! `QuerySource`, against `psql`'s `\copy` of the same query.

use std::time::Instant;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{PgCopySource, QuerySource};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::services::Database;

const KEY_QUERY: &str = "select key from items";

/// Which source to warm up from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SourceKind {
    /// `PgCopySource`.
    Copy,
    /// `QuerySource`.
    Query,
}

/// One warm-up, as the child process reports it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WarmupResult {
    source: String,
    keys: u64,
    seconds: f64,
    keys_per_sec: f64,
    peak_rss_mib: f64,
    filter_mib: f64,
}

/// Warms a guard up in this process and prints the result as JSON.
pub(crate) async fn one(source: SourceKind, url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PgPool::connect(url).await?;
    let guard = BloomGuard::builder().build();
    let started = Instant::now();
    let stats = match source {
        SourceKind::Copy => guard.rebuild(&PgCopySource::new(pool, KEY_QUERY)).await?,
        SourceKind::Query => guard.rebuild(&QuerySource::new(pool, KEY_QUERY)).await?,
    };
    let seconds = started.elapsed().as_secs_f64();
    let result = WarmupResult {
        source: format!("{source:?}").to_lowercase(),
        keys: stats.keys,
        seconds,
        keys_per_sec: stats.keys as f64 / seconds,
        peak_rss_mib: peak_rss_mib(),
        filter_mib: stats.bits as f64 / 8.0 / 1024.0 / 1024.0,
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
    for source in ["copy", "query"] {
        let output = tokio::process::Command::new(&me)
            .args(["warmup-one", "--source", source, "--url", &db.url])
            .output()
            .await?;
        let result: WarmupResult = serde_json::from_slice(&output.stdout).map_err(|e| {
            format!(
                "warm-up with {source} failed: {e}: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        println!(
            "{source:>5}: {:.2} s ({:.0} keys/s) = {:.2}x psql; peak RSS {:.1} MiB, filter {:.1} MiB, RSS - filter {:.1} MiB",
            result.seconds,
            result.keys_per_sec,
            result.seconds / psql_seconds,
            result.peak_rss_mib,
            result.filter_mib,
            result.peak_rss_mib - result.filter_mib
        );
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
