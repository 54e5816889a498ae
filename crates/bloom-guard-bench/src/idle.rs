//! `bloom-load idle`: what idle instances of the example service (two
//! guards each, one process each) cost the database: transactions a
//! second on Postgres for one, two and eight instances, and statements a
//! second on MySQL or MariaDB for one.

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
    let db = Database::create(server_url, "bloom_guard_idle").await?;
    let mut report = Vec::new();
    for instances in [1_u16, 2, 8] {
        let mut services = Vec::new();
        for i in 0..instances {
            let env = [("DATABASE_URL", db.url.clone())];
            services.push(Service::start_with(binary, 4100 + 10 * i, &env).await?);
        }
        tokio::time::sleep(SETTLE).await;
        let rate = transactions_per_sec(db.pool(), WINDOW).await?;
        println!("postgres: {instances} idle instances (2 guards each): {rate:.2} transactions/s");
        report.push(serde_json::json!({
            "database": "postgres",
            "instances": instances,
            "guards_per_instance": 2,
            "transactions_per_sec": rate,
        }));
        drop(services);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    db.drop_database().await?;
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

/// The statements the MySQL server has run so far (`Questions`).
async fn questions(conn: &mut sqlx::MySqlConnection) -> Result<u64, sqlx::Error> {
    let (_, count): (String, String) = sqlx::query_as("show global status like 'Questions'")
        .fetch_one(conn)
        .await?;
    Ok(count.parse().unwrap_or(0))
}
