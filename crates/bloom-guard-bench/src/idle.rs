//! `bloom-load idle`: what idle instances of the example service (two
//! guards each, one process each) cost the database: transactions a
//! second and the server's CPU on Postgres for one, two and eight
//! instances, on the trigger feed and (where the server decodes its log)
//! on the log feed, and statements a second on MySQL or MariaDB for one.

use std::path::Path;
use std::time::Duration;

use sqlx::{ConnectOptions, Connection};

use crate::services::{Database, Service};
use crate::writers::transactions_per_sec;

/// Past the start-up's scans, first checks and back-offs, and the
/// autovacuum of the fresh tables.
const SETTLE: Duration = Duration::from_secs(15);
/// The window measured.
const WINDOW: Duration = Duration::from_secs(60);

/// `bloom-load idle`.
pub(crate) async fn idle(
    server_url: &str,
    binary: &Path,
    mysql_url: Option<&str>,
    out: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut report = Vec::new();
    for feed in ["triggers", "log"] {
        // A database of its own per feed: a table has one feed.
        let db = Database::create(server_url, &format!("bloom_guard_idle_{feed}")).await?;
        let level: String = sqlx::query_scalar("show wal_level")
            .fetch_one(db.pool())
            .await?;
        if feed == "log" && level != "logical" {
            println!("the server's wal_level is not logical: the log feed is not measured");
            db.drop_database().await?;
            continue;
        }
        for instances in [1_u16, 2, 8] {
            let mut services = Vec::new();
            for i in 0..instances {
                let env = [
                    ("DATABASE_URL", db.url.clone()),
                    ("BLOOM_FEED", feed.to_owned()),
                ];
                services.push(Service::start_with(binary, 4100 + 10 * i, &env).await?);
            }
            tokio::time::sleep(SETTLE).await;
            let cpu = server_cpu_seconds();
            let rate = transactions_per_sec(db.pool(), WINDOW).await?;
            // The server's CPU, all of its processes (the walsender's
            // decoding included), as a share of one core.
            let cpu = (server_cpu_seconds() - cpu) / WINDOW.as_secs_f64();
            println!(
                "postgres, {feed} feed: {instances} idle instances (2 guards each): {rate:.2} transactions/s, server CPU {:.2}% of a core",
                cpu * 100.0
            );
            report.push(serde_json::json!({
                "database": "postgres",
                "feed": feed,
                "instances": instances,
                "guards_per_instance": 2,
                "transactions_per_sec": rate,
                "server_cpu_share_of_a_core": cpu,
            }));
            drop(services);
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        db.drop_database().await?;
    }
    if let Some(url) = mysql_url {
        let options = crate::mysql::create_database(url, "bloom_guard_idle").await?;
        // The same server and credentials, the new database.
        let (scheme, rest) = url.split_once("://").unwrap_or(("mysql", url));
        let server = rest.split_once('/').map_or(rest, |(server, _)| server);
        let database_url = format!("{scheme}://{server}/bloom_guard_idle");
        let service = Service::start_with(binary, 4200, &[("DATABASE_URL", database_url)]).await?;
        tokio::time::sleep(SETTLE).await;
        let mut conn = options.connect().await?;
        let before = questions(&mut conn).await?;
        tokio::time::sleep(WINDOW).await;
        let after = questions(&mut conn).await?;
        // The two counting statements are not the instance's.
        let rate = after.saturating_sub(before + 2) as f64 / WINDOW.as_secs_f64();
        println!("mysql: 1 idle instance (2 guards): {rate:.2} statements/s");
        report.push(serde_json::json!({
            "database": "mysql",
            "instances": 1,
            "guards_per_instance": 2,
            "statements_per_sec": rate,
        }));
        drop(service);
        let _ = conn.close().await;
    }
    std::fs::write(out.join("idle.json"), serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}

/// The CPU time every `postgres` process on this machine has used so far,
/// in seconds (Linux's `/proc`; 0 elsewhere). Processes that ended
/// meanwhile are not counted: compare windows in which none did.
fn server_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let ticks: u64 = entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| {
            // `pid (comm) state ...`: the fields after the name.
            let (name, rest) = stat.rsplit_once(") ")?;
            if !name.ends_with("(postgres") {
                return None;
            }
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime: fields 14 and 15, the 12th and 13th after.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    // Linux reports 100 ticks a second to user space.
    ticks as f64 / 100.0
}

/// The statements the MySQL server has run so far (`Questions`).
async fn questions(conn: &mut sqlx::MySqlConnection) -> Result<u64, sqlx::Error> {
    let (_, count): (String, String) = sqlx::query_as("show global status like 'Questions'")
        .fetch_one(conn)
        .await?;
    Ok(count.parse().unwrap_or(0))
}
