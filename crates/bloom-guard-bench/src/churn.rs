//! Deleted keys on a table with churn: rounds of `psql` deletes and
//! inserts on a watched table, with two followed guards (one with the
//! counting filter, one that keeps the Bloom filter); two seconds after
//! each round, the deleted keys each lets through, and the keys it counts.

use std::time::Duration;

use bloom_guard::BloomGuard;
use bloom_guard_sqlx::{postgres, Watch};

use crate::services::Database;

/// A followed guard, stopped when dropped.
struct Followed {
    guard: BloomGuard,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn follow(db: &Database, forget: bool) -> Followed {
    let guard = BloomGuard::builder()
        .name("items")
        .forget_deleted_keys(forget)
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let follower = postgres::Follower::new(
        guard.clone(),
        db.pool().clone(),
        Watch::table("items").key("key"),
    )
    // Each instance scans: the two kinds share no snapshot.
    .snapshots(false)
    .instance_id(if forget { "counting" } else { "bloom" });
    tokio::spawn(follower.run_until(async {
        let _ = stopped.await;
    }));
    Followed { guard, _stop: stop }
}

async fn psql(db: &Database, sql: &str) -> Result<(), Box<dyn std::error::Error>> {
    let status = tokio::process::Command::new("psql")
        .arg(&db.url)
        .args(["-qc", sql])
        .status()
        .await?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("psql failed: {sql}").into())
    }
}

/// `rounds` rounds of `batch` deletes (the oldest keys) and `batch` inserts
/// (new keys) by `psql` on a table of `keys` rows.
pub(crate) async fn churn(
    server_url: &str,
    out: &std::path::Path,
    keys: u64,
    batch: u64,
    rounds: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::create(server_url, "bloom_guard_churn").await?;
    db.fill(keys).await?;
    bloom_guard_sqlx::postgres::install(db.pool()).await?;
    Watch::table("items").key("key").install(db.pool()).await?;
    let counting = follow(&db, true);
    let bloom = follow(&db, false);
    for guard in [&counting.guard, &bloom.guard] {
        guard.ready().await;
    }
    println!("| round | rows | filter | deleted keys let through | keys in the filter | deletes applied | rebuilds |");
    println!("|---:|---:|---|---:|---:|---:|---:|");
    let mut deleted: Vec<String> = Vec::new();
    let mut report = Vec::new();
    for round in 1..=rounds {
        let (from, to) = ((round - 1) * batch + 1, round * batch);
        psql(
            &db,
            &format!("delete from items where key in (select 'key-' || g from generate_series({from}, {to}) g)"),
        )
        .await?;
        psql(
            &db,
            &format!(
                "insert into items (key) select 'key-' || g from generate_series({}, {}) g",
                keys + from,
                keys + to
            ),
        )
        .await?;
        deleted.extend((from..=to).map(|i| format!("key-{i}")));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rows: i64 = sqlx::query_scalar("select count(*) from items")
            .fetch_one(db.pool())
            .await?;
        for (name, guard) in [("counting", &counting.guard), ("bloom", &bloom.guard)] {
            let through = deleted.iter().filter(|key| guard.may_contain(key)).count();
            let stats = guard.stats();
            println!(
                "| {round} | {rows} | {name} | {through} of {} | {} | {} | {} |",
                deleted.len(),
                stats.keys,
                stats.deletes_applied,
                stats.generation.saturating_sub(1)
            );
            report.push(serde_json::json!({
                "round": round, "rows": rows, "filter": name,
                "deleted": deleted.len(), "let_through": through,
                "keys": stats.keys, "deletes_applied": stats.deletes_applied,
                "rebuilds": stats.generation.saturating_sub(1),
            }));
        }
    }
    std::fs::write(
        out.join("churn.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    drop((counting, bloom));
    tokio::time::sleep(Duration::from_millis(200)).await;
    db.drop_database().await?;
    Ok(())
}
