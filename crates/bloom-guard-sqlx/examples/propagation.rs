//! Propagation latency: from the COMMIT of an insert on one connection to
//! the key's presence in another instance's filter, through the NOTIFY
//! trigger and a `PgFollower`.
//!
//! Run with
//! `DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --release -p bloom-guard-sqlx --example propagation`.
//! It creates (and afterwards drops) the database `bloom_guard_propagation`.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::time::{Duration, Instant};

use bloom_guard::{BloomGuard, State};
use bloom_guard_sqlx::PgFollower;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

const SAMPLES: usize = 2000;
const DATABASE: &str = "bloom_guard_propagation";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a Postgres server")?;
    let server: PgConnectOptions = url.parse()?;
    let mut admin = server.connect().await?;
    sqlx::query(&format!("drop database if exists {DATABASE} with (force)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("create database {DATABASE}"))
        .execute(&mut admin)
        .await?;

    let pool = PgPool::connect_with(server.clone().database(DATABASE)).await?;
    sqlx::migrate!("../../migrations").run(&pool).await?;
    let guard = BloomGuard::builder().expected_items(10_000).build();
    let follower =
        tokio::spawn(PgFollower::new(guard.clone(), pool.clone(), "select key from items").run());
    while !guard.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The writer: its own connection, as another instance would have.
    let mut writer = PgConnection::connect_with(&server.clone().database(DATABASE)).await?;
    let mut latencies = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let key = format!("propagation-{i}");
        let mut tx = writer.begin().await?;
        sqlx::query("insert into items (key) values ($1)")
            .bind(&key)
            .execute(&mut *tx)
            .await?;
        let started = Instant::now();
        tx.commit().await?;
        while !(guard.may_contain(&key) && guard.stats().state == State::Ready) {
            tokio::task::yield_now().await;
        }
        latencies.push(started.elapsed());
    }
    follower.abort();
    drop(pool);
    sqlx::query(&format!("drop database if exists {DATABASE} with (force)"))
        .execute(&mut admin)
        .await?;

    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "propagation over {SAMPLES} commits: p50 {:?}, p99 {:?}, max {:?}",
        at(0.50),
        at(0.99),
        latencies[latencies.len() - 1]
    );
    Ok(())
}
