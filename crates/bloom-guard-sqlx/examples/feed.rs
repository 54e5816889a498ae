//! The change feed's figures: propagation from a commit on one connection
//! to another instance's filter, the write cost of a watched table against
//! the same table unwatched, and the catch-up after a 10 s outage of the
//! follower's connections with 10 000 writes meanwhile.
//!
//! Run with
//! `DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --release -p bloom-guard-sqlx --example feed`.
//! It creates (and afterwards drops) the database `bloom_guard_feed_bench`.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloom_guard::{stats::GuardState, BloomGuard};
use bloom_guard_sqlx::{postgres, Watch};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

const SAMPLES: usize = 2000;
const DATABASE: &str = "bloom_guard_feed_bench";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a Postgres server")?;
    let server: PgConnectOptions = url.parse()?;
    let mut admin = server.connect().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {DATABASE} with (force)"
    )))
    .execute(&mut admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("create database {DATABASE}")))
        .execute(&mut admin)
        .await?;
    let options = server.clone().database(DATABASE);
    let pool = PgPool::connect_with(options.clone()).await?;
    sqlx::raw_sql(
        "create table items (id bigint generated always as identity primary key, key text not null unique);
         create table plain (id bigint generated always as identity primary key, key text not null unique);",
    )
    .execute(&pool)
    .await?;
    bloom_guard_sqlx::postgres::install(&pool).await?;
    Watch::table("items").key("key").install(&pool).await?;

    write_cost(&options).await?;
    propagation(&pool, &options).await?;
    catch_up(&pool, &options).await?;

    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {DATABASE} with (force)"
    )))
    .execute(&mut admin)
    .await?;
    Ok(())
}

/// Single-row inserts (one transaction each) and one 100 000-row insert,
/// into the watched table and the unwatched twin, alternating.
async fn write_cost(options: &PgConnectOptions) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = PgConnection::connect_with(options).await?;
    let runs = [
        ("single-row inserts", 1, 5000),
        ("100 000-row insert", 100_000, 3),
    ];
    for (kind, (label, rows, statements)) in runs.into_iter().enumerate() {
        let mut times = [Duration::ZERO; 2];
        for round in 0..statements {
            for (slot, table) in ["plain", "items"].iter().enumerate() {
                let sql = format!(
                    "insert into {table} (key) select 'cost-{kind}-{round}-' || g from generate_series(1, {rows}) g"
                );
                let started = Instant::now();
                sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .execute(&mut conn)
                    .await?;
                times[slot] += started.elapsed();
            }
        }
        let per = |t: Duration| t / statements as u32;
        println!(
            "{label}: unwatched {:?}, watched {:?} per statement: {:.2}x",
            per(times[0]),
            per(times[1]),
            times[1].as_secs_f64() / times[0].as_secs_f64()
        );
    }
    Ok(())
}

async fn followed(pool: &PgPool) -> (BloomGuard, tokio::task::JoinHandle<()>) {
    let guard = BloomGuard::builder().expected_items(1_000_000).build();
    let task = tokio::spawn(
        postgres::Follower::new(
            guard.clone(),
            pool.clone(),
            Watch::table("items").key("key"),
        )
        .run(),
    );
    while !guard.is_ready() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (guard, task)
}

/// From COMMIT on a writer's connection to the key in another instance's
/// filter.
async fn propagation(
    pool: &PgPool,
    options: &PgConnectOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, follower) = followed(pool).await;
    let mut writer = PgConnection::connect_with(options).await?;
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
        while !(guard.may_contain(&key) && guard.stats().state == GuardState::Ready) {
            tokio::task::yield_now().await;
        }
        latencies.push(started.elapsed());
    }
    follower.abort();
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

/// The follower reaches Postgres through a proxy that goes down for 10 s
/// while 10 000 keys are written directly; then: how long until all are in
/// the filter, and was any rebuild needed.
async fn catch_up(
    pool: &PgPool,
    options: &PgConnectOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    let upstream: SocketAddr = format!("{}:{}", options.get_host(), options.get_port()).parse()?;
    let proxy = Proxy::start(upstream).await?;
    let proxied = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy_with(
            options
                .clone()
                .host(&proxy.addr.ip().to_string())
                .port(proxy.addr.port()),
        );
    let (guard, follower) = followed(&proxied).await;
    let generation = guard.stats().generation;
    proxy.down();
    let keys: Vec<String> = (0..10_000).map(|i| format!("outage-{i}")).collect();
    let started = Instant::now();
    for chunk in keys.chunks(100) {
        sqlx::query("insert into items (key) select * from unnest($1::text[])")
            .bind(chunk)
            .execute(pool)
            .await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    let ready_throughout = guard.stats().state == GuardState::Ready;
    proxy.up();
    let back = Instant::now();
    while !keys.iter().all(|key| guard.may_contain(key)) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "catch-up after a 10 s outage with 10 000 writes: {:?} after the database was reachable again; rebuilds: {}; ready throughout: {ready_throughout}",
        back.elapsed(),
        guard.stats().generation - generation
    );
    follower.abort();
    Ok(())
}

/// A TCP proxy that can drop every connection and refuse new ones.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    cut: broadcast::Sender<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let (cut, _) = broadcast::channel(1);
        let (accepting, cuts) = (Arc::clone(&up), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !accepting.load(Ordering::SeqCst) {
                    continue;
                }
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.recv() => {}
                    }
                });
            }
        });
        Ok(Self { addr, up, cut })
    }

    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        let _ = self.cut.send(());
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}
