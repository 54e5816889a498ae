//! `bloom-load cross`: a key created through one instance of the example
//! service and read through another at once, the way a client of a fleet
//! behind one address creates and then reads. Two processes on one
//! Postgres database, then on one SQLite file, then (with a MySQL URL) on
//! one MySQL or MariaDB database, and (on a server with `wal_level=logical`)
//! on one Postgres database on the log feed (`BLOOM_FEED=log`); each with
//! the read barrier
//! (the default) and without it (`BLOOM_READ_BARRIER=off`). Reports the
//! refusals (404) and the read's latency.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::services::{self, Database, Service};

/// One run: a backend, the barrier on or off.
#[derive(Debug, Serialize)]
struct Run {
    backend: &'static str,
    read_barrier: bool,
    requests: usize,
    refused: usize,
    read_p50_ms: f64,
    read_p99_ms: f64,
}

/// `bloom-load cross`.
pub(crate) async fn cross(
    server_url: &str,
    mysql_url: Option<&str>,
    binary: &Path,
    out: &Path,
    requests: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = Database::create(server_url, "bloom_guard_cross").await?;
    // The log feed's (`BLOOM_FEED=log`): a database of its own, since a
    // table has one feed; the server must decode its log.
    let level: String = sqlx::query_scalar("show wal_level")
        .fetch_one(db.pool())
        .await?;
    let log_db = if level == "logical" {
        Some(Database::create(server_url, "bloom_guard_cross_log").await?)
    } else {
        println!("the server's wal_level is not logical: the log feed is not measured");
        None
    };
    let mysql = match mysql_url {
        Some(url) => Some(mysql_database(url, "bloom_guard_cross").await?),
        None => None,
    };
    let dir = std::env::temp_dir().join(format!("bloom-load-cross-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut runs = Vec::new();
    let mut backends = vec![
        ("postgres", true),
        ("postgres", false),
        ("sqlite", true),
        ("sqlite", false),
    ];
    if log_db.is_some() {
        backends.extend([("postgres-log", true), ("postgres-log", false)]);
    }
    if mysql.is_some() {
        backends.extend([("mysql", true), ("mysql", false)]);
    }
    for (run, (backend, read_barrier)) in backends.into_iter().enumerate() {
        // Ports of their own: the last run's processes may still hold theirs.
        let port = 3110 + 20 * run as u16;
        let mut env = vec![(
            "BLOOM_READ_BARRIER",
            if read_barrier { "on" } else { "off" }.to_owned(),
        )];
        if backend == "postgres" {
            env.push(("DATABASE_URL", db.url.clone()));
        } else if let (Some(log_db), "postgres-log") = (&log_db, backend) {
            env.push(("DATABASE_URL", log_db.url.clone()));
            env.push(("BLOOM_FEED", "log".to_owned()));
        } else if let (Some(url), "mysql") = (&mysql, backend) {
            env.push(("DATABASE_URL", url.clone()));
        } else {
            let file = dir.join(format!("items-{read_barrier}.db"));
            env.push(("SQLITE_PATH", file.display().to_string()));
        }
        // The second starts once the first has migrated the database.
        let one = Service::start_with(binary, port, &env).await?;
        let two = Service::start_with(binary, port + 10, &env).await?;
        let mut refused = 0;
        let mut reads = Vec::with_capacity(requests);
        for i in 0..requests {
            let key = format!("cross-{backend}-{read_barrier}-{i}");
            let created =
                services::post_json(&one.addr, "/items", format!(r#"{{"key":"{key}"}}"#)).await;
            if created != Some(201) {
                return Err(
                    format!("creating {key} through {} answered {created:?}", one.addr).into(),
                );
            }
            let started = Instant::now();
            let read = services::get(&two.addr, &format!("/items/{key}")).await;
            reads.push(started.elapsed().as_secs_f64() * 1000.0);
            match read {
                Some(200) => {}
                Some(404) => refused += 1,
                other => return Err(format!("reading {key} answered {other:?}").into()),
            }
        }
        reads.sort_by(f64::total_cmp);
        let at = |q: f64| reads[((reads.len() - 1) as f64 * q).round() as usize];
        let run = Run {
            backend,
            read_barrier,
            requests,
            refused,
            read_p50_ms: at(0.5),
            read_p99_ms: at(0.99),
        };
        println!(
            "{backend}, read barrier {}: {refused} of {requests} refused; the read p50 {:.2} ms, p99 {:.2} ms",
            if read_barrier { "on" } else { "off" },
            run.read_p50_ms,
            run.read_p99_ms
        );
        runs.push(run);
    }
    std::fs::write(out.join("cross.json"), serde_json::to_vec_pretty(&runs)?)?;
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_database().await?;
    if let Some(log_db) = log_db {
        log_db.drop_database().await?;
    }
    Ok(())
}

/// A new, empty database `name` on the MySQL server of `server_url` (both
/// runs share it, as the Postgres ones do); its URL.
async fn mysql_database(
    server_url: &str,
    name: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    crate::mysql::create_database(server_url, name).await?;
    // The server's URL with the database replaced: `scheme://authority/name`.
    let (scheme, rest) = server_url
        .split_once("://")
        .ok_or("a MySQL URL has the form mysql://user@host:port/database")?;
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    Ok(format!("{scheme}://{authority}/{name}"))
}
