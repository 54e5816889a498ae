//! `bloom-load start`: a deploy of the whole example service, process
//! start to every guard ready, after a bulk load.
//!
//! The database holds both guards' snapshots of their empty tables (a first
//! instance published them and stopped); a bulk load then inserts `keys`
//! rows into `items` through the feed's triggers. The first start finds no
//! snapshot of `items` (it is deleted) and scans; it publishes one. Every
//! second start adopts it, while `users`' snapshot still predates the bulk
//! load: its catch-up must skip the feed rows of `items`. Beside them, what
//! reading the same bytes costs without the guard: `psql`'s `\copy` of the
//! key column, a plain `SELECT` of it, and the snapshot's chunks alone.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::services::{self, Database};

/// What `bloom-load start` measures.
pub(crate) struct StartSettings {
    pub(crate) keys: Vec<u64>,
    pub(crate) rounds: usize,
    /// Appended to the services' database URL (`sslmode=disable`).
    pub(crate) url_options: Option<String>,
    /// The services' `BLOOM_FEED`: `triggers` or `log`.
    pub(crate) feed: String,
}

/// One key count's deploy.
#[derive(Debug, Serialize)]
struct StartRow {
    keys: u64,
    /// The snapshot of `items`, in bytes: about the filter's size.
    filter_bytes: u64,
    first_start_s: f64,
    first_peak_rss_bytes: u64,
    /// On the log feed: from the first start until its producer had
    /// written the bulk load's feed rows (the slot confirmed the log);
    /// refusals meanwhile wait for it, or go to the handler.
    first_producer_s: Option<f64>,
    /// The median second start.
    second_start_s: f64,
    second_peak_rss_bytes: u64,
    /// From the second start's log: the snapshot's load and the whole
    /// adoption with its catch-up, per guard.
    second_items_load_ms: Option<u64>,
    second_items_total_ms: Option<u64>,
    second_users_total_ms: Option<u64>,
    copy_s: f64,
    select_s: f64,
    snapshot_read_s: f64,
}

/// `bloom-load start`.
pub(crate) async fn start(
    server_url: &str,
    binary: &Path,
    out: &Path,
    settings: &StartSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for &keys in &settings.keys {
        let db = Database::create(server_url, "bloom_guard_start").await?;
        let row = deploy(&db, binary, out, keys, settings).await;
        db.drop_database().await?;
        let row = row?;
        println!("{row:?}");
        rows.push(row);
    }
    report(&rows);
    std::fs::write(out.join("start.json"), serde_json::to_string_pretty(&rows)?)?;
    println!("wrote {}", out.join("start.json").display());
    Ok(())
}

async fn deploy(
    db: &Database,
    binary: &Path,
    out: &Path,
    keys: u64,
    settings: &StartSettings,
) -> Result<StartRow, Box<dyn std::error::Error>> {
    let url = match &settings.url_options {
        Some(options) => format!("{}?{options}", db.url),
        None => db.url.clone(),
    };
    let log = out.join("start.log");
    // The first instance: the feed installed, both tables watched, and
    // snapshots of both empty tables published.
    let setup = Process::start(binary, &url, &settings.feed, &log).await?;
    wait_for_snapshots(db, 0).await?;
    setup.stop().await?;
    println!("bulk load of {keys} rows");
    db.fill(keys).await?;
    sqlx::query("delete from bloom_guard.snapshots where guard = 'items'")
        .execute(db.pool())
        .await?;

    // Its own log, kept: the second starts write theirs over `log`.
    let first = Process::start(binary, &url, &settings.feed, &out.join("start-first.log")).await?;
    let first_start_s = first.ready.as_secs_f64();
    let first_producer_s = if settings.feed == "log" {
        Some(first_start_s + crate::log_twin::catch_up(db.pool()).await?.as_secs_f64())
    } else {
        None
    };
    let filter_bytes = wait_for_snapshots(db, keys).await?;
    let first_peak_rss_bytes = first.peak_rss();
    first.stop().await?;

    let mut seconds = Vec::new();
    for _ in 0..settings.rounds {
        let second = Process::start(binary, &url, &settings.feed, &log).await?;
        let (ready, peak) = (second.ready.as_secs_f64(), second.peak_rss());
        second.stop().await?;
        seconds.push((ready, peak, std::fs::read_to_string(&log)?));
    }
    seconds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (second_start_s, second_peak_rss_bytes, text) = seconds.swap_remove(seconds.len() / 2);

    Ok(StartRow {
        keys,
        filter_bytes,
        first_start_s,
        first_peak_rss_bytes,
        first_producer_s,
        second_start_s,
        second_peak_rss_bytes,
        second_items_load_ms: adopted(&text, "items", "load_ms"),
        second_items_total_ms: adopted(&text, "items", "total_ms"),
        second_users_total_ms: adopted(&text, "users", "total_ms"),
        copy_s: psql(&db.url, "\\copy (select key from items) to '/dev/null'").await?,
        select_s: psql(&db.url, "select key from items").await?,
        snapshot_read_s: read_snapshot(db).await?,
    })
}

/// An items-service process, killed when dropped or stopped.
struct Process {
    child: Child,
    /// From the process's start to `/readyz` answering 200.
    ready: Duration,
}

impl Process {
    async fn start(
        binary: &Path,
        url: &str,
        feed: &str,
        log: &Path,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let addr = "127.0.0.1:3950";
        let started = Instant::now();
        let child = Command::new(binary)
            .env("DATABASE_URL", url)
            .env("BLOOM_FEED", feed)
            .env("BIND_ADDR", addr)
            .env("ADMIN_ADDR", "127.0.0.1:3951")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::fs::File::create(log)?)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        while services::get(addr, "/readyz").await != Some(200) {
            if started.elapsed() > Duration::from_secs(300) {
                return Err(format!("{addr} did not become ready (see {})", log.display()).into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(Self {
            child,
            ready: started.elapsed(),
        })
    }

    /// Kills the process and waits for it to exit, its port free.
    async fn stop(mut self) -> std::io::Result<()> {
        self.child.kill().await
    }

    /// The process's peak resident memory so far (`VmHWM`).
    fn peak_rss(&self) -> u64 {
        let Some(pid) = self.child.id() else { return 0 };
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                status.lines().find_map(|line| {
                    let kib = line.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?;
                    kib.trim().parse::<u64>().ok()
                })
            })
            .map_or(0, |kib| kib * 1024)
    }
}

/// Waits until both guards have a snapshot and `items`' holds at least
/// `keys`; the bytes of `items`' newest.
async fn wait_for_snapshots(db: &Database, keys: u64) -> Result<u64, Box<dyn std::error::Error>> {
    let started = Instant::now();
    loop {
        let (guards, bytes): (i64, Option<i64>) = sqlx::query_as(
            "select count(distinct guard),
                    max(len) filter (where guard = 'items' and keys >= $1)
               from bloom_guard.snapshots",
        )
        .bind(i64::try_from(keys)?)
        .fetch_one(db.pool())
        .await?;
        if let (2, Some(bytes)) = (guards, bytes) {
            return Ok(u64::try_from(bytes)?);
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("no snapshot was published".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A field of the "adopted the filter's snapshot" line of `guard`.
fn adopted(log: &str, guard: &str, field: &str) -> Option<u64> {
    let line = log.lines().find(|line| {
        line.contains("adopted the filter's snapshot")
            && line.contains(&format!("guard=\"{guard}\""))
    })?;
    let value = line.split_once(&format!("{field}="))?.1;
    value
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Seconds `psql` takes to run `command`, its output thrown away.
async fn psql(url: &str, command: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let status = Command::new("psql")
        .arg(url)
        .arg("-qAt")
        .arg("-c")
        .arg(command)
        .stdout(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if !status.success() {
        return Err(format!("psql failed: {command}").into());
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds to read the newest snapshot of `items`' chunks, as bytes.
async fn read_snapshot(db: &Database) -> Result<f64, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut chunks = sqlx::query_scalar::<_, Vec<u8>>(
        "select data from bloom_guard.snapshot_chunks
          where snapshot = (select max(id) from bloom_guard.snapshots where guard = 'items')
          order by seq",
    )
    .fetch(db.pool());
    let mut bytes = 0;
    while let Some(chunk) = chunks.try_next().await? {
        bytes += chunk.len();
    }
    if bytes == 0 {
        return Err("the snapshot has no bytes".into());
    }
    Ok(started.elapsed().as_secs_f64())
}

fn report(rows: &[StartRow]) {
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "\n| keys | first start | second start | ÷ first | snapshot read | ÷ snapshot | \\copy | first ÷ \\copy | SELECT | peak RSS first / second | filter |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for row in rows {
        if let Some(producer) = row.first_producer_s {
            println!("{} keys: the first start's producer wrote the load's feed rows after {producer:.2} s", row.keys);
        }
        println!(
            "| {} | {:.2} s | {:.3} s | {:.2} | {:.3} s | {:.2} | {:.2} s | {:.2} | {:.2} s | {:.1} / {:.1} MiB | {:.1} MiB |",
            row.keys,
            row.first_start_s,
            row.second_start_s,
            row.second_start_s / row.first_start_s,
            row.snapshot_read_s,
            row.second_start_s / row.snapshot_read_s,
            row.copy_s,
            row.first_start_s / row.copy_s,
            row.select_s,
            mib(row.first_peak_rss_bytes),
            mib(row.second_peak_rss_bytes),
            mib(row.filter_bytes),
        );
    }
}
