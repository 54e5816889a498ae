//! `bloom-load`: the load and warm-up benchmarks of bloom-guard.
//!
//! `bloom-load run` fills a Postgres database, starts the items service
//! twice (guarded, and with `BLOOM_GUARD=off`), and drives both with the
//! attack (random absent keys), a hot set of existing keys, a mix (90%
//! absent) and a rebuild under attack, next to the HTTP stack's own 404 for
//! an unrouted path (the ceiling). It reports req/s, latency percentiles,
//! errors and database lookups per 1000 requests (from
//! `pg_stat_user_tables`), and writes `results.json` and `chart.svg`.
//!
//! `bloom-load barrier` floods the service with absent keys at 64, 256 and
//! 1 024 connections (by `wrk`), the read barrier on and off, beside the
//! same process's unrouted 404, and counts the database reads; then a flood
//! at a fixed rate and one spread over four instances.
//!
//! `bloom-load drive --addr 127.0.0.1:3000 --workload attack` drives a
//! service that is already running with one workload.
//!
//! `bloom-load warmup` loads 10M keys with `PgCopySource` and `QuerySource`
//! and compares keys/s and peak RSS with `psql`'s `\copy` of the same query.
//!
//! `bloom-load churn` deletes and inserts rows by `psql` in rounds and
//! counts the deleted keys a counting and a Bloom guard let through.
//!
//! `bloom-load start` times a deploy of the whole service, process start to
//! every guard ready, first (a scan) and second (a snapshot), at 1M and 5M
//! keys, beside `psql`'s `\copy` of the keys and a read of the snapshot.
//!
//! `bloom-load deploy` starts an instance after a bulk load that followed
//! a snapshot of the empty table: its time to ready and to protection, and
//! its full scans.
//!
//! `bloom-load writers`, `propagation`, `idle` and `retention` measure the
//! change feed: what it costs writers (watched table ÷ unwatched twin, 1 to
//! 32 writers), commit-to-filter latency, the primary's load from idle
//! instances, and the feed's size and dead tuples under a short retention.
//! `bloom-load fleet` times a fleet-wide mode switch until every instance
//! has it.
//!
//! `bloom-load mysql` measures the MySQL/MariaDB backend: writers on a
//! watched table ÷ its unwatched twin, propagation, warm-up ÷ a plain
//! `SELECT`.
//!
//! Run with `cargo run --release -p bloom-guard-bench -- run` (after
//! `cargo build --release -p items-service`).

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

mod barrier;
mod chart;
mod churn;
mod cross;
mod deploy;
mod fleet;
mod load;
mod mysql;
mod propagation;
mod run;
mod services;
mod start;
mod warmup;
mod writers;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::load::Workload;

#[derive(Debug, Parser)]
#[command(about = "Load and warm-up benchmarks of bloom-guard")]
struct Cli {
    /// A Postgres server; the benchmark creates its own databases there.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// Where results.json and chart.svg go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The HTTP load comparison.
    Run {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// Rows in the items table.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        #[command(flatten)]
        load: LoadArgs,
        /// The guard's target false-positive rate.
        #[arg(long, default_value_t = 0.001)]
        fpp: f64,
        /// Rounds of the whole plan; each row reports its median round.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Refusals under a flood with the read barrier on and off, beside
    /// the unrouted 404, and the database reads they cost (needs `wrk`).
    Barrier {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// Rows in the items table.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Seconds per flood.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The floods' connection counts.
        #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
        connections: Vec<usize>,
        /// The fixed-rate flood's requests a second.
        #[arg(long, default_value_t = 5000.0)]
        rate: f64,
        /// Instances under the spread flood.
        #[arg(long, default_value_t = 4)]
        instances: usize,
        /// Rounds of the floods; each row reports its median round.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// A deploy of the whole service after a bulk load: process start to
    /// every guard ready, first and second start, with peak memory,
    /// beside `psql`'s `\copy` and a read of the snapshot (needs `psql`).
    Start {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// Rows in the items table, one deploy each.
        #[arg(long, value_delimiter = ',', default_value = "1000000,5000000")]
        keys: Vec<u64>,
        /// Second starts; the row reports the median.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Appended to the service's database URL, e.g. `sslmode=disable`.
        #[arg(long)]
        url_options: Option<String>,
    },
    /// One workload against a service that is already running.
    Drive {
        /// The service's address.
        #[arg(long, default_value = "127.0.0.1:3000")]
        addr: String,
        /// attack, hot, mix or unrouted.
        #[arg(long, value_enum, default_value = "attack")]
        workload: Workload,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The warm-up comparison: COPY source, query source, psql \copy.
    Warmup {
        /// Rows in the items table.
        #[arg(long, default_value_t = 10_000_000)]
        keys: u64,
    },
    /// Deleted keys under churn: rounds of psql deletes and inserts, the
    /// deleted keys a counting and a Bloom guard let through 2 s later.
    Churn {
        /// Rows in the table.
        #[arg(long, default_value_t = 20_000)]
        keys: u64,
        /// Rows deleted and inserted per round.
        #[arg(long, default_value_t = 10_000)]
        batch: u64,
        /// Rounds.
        #[arg(long, default_value_t = 5)]
        rounds: u64,
    },
    /// A deploy after a bulk load: a new instance's time to ready and to
    /// protection, and its full scans, after a snapshot of the empty table.
    Deploy {
        /// Rows bulk-loaded, one run each.
        #[arg(long, value_delimiter = ',', default_values_t = [200_000_u64, 5_000_000])]
        keys: Vec<u64>,
    },
    /// What the change feed costs writers: 1, 8, 32 writers × four kinds
    /// of statement, watched table against its unwatched twin.
    Writers {
        /// Seconds per measured run (each cell runs four).
        #[arg(long, default_value_t = 4)]
        seconds: u64,
        /// Only these numbers of writers (default 1, 8 and 32).
        #[arg(long, value_delimiter = ',')]
        writers: Vec<usize>,
        /// Only these statements: insert, insert_100, update_key, delete.
        #[arg(long, value_delimiter = ',')]
        statements: Vec<String>,
    },
    /// Commit → another instance's filter, idle and under 2 000 writes/s.
    Propagation {
        /// Samples per kind of write and load.
        #[arg(long, default_value_t = 300)]
        samples: usize,
    },
    /// The primary's transactions per second from idle instances.
    Idle,
    /// A key created through one instance and read through another at
    /// once: refusals with and without the read barrier, Postgres and
    /// SQLite (and MySQL with `--mysql-url`).
    Cross {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// Keys created and read, per run.
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// A MySQL or MariaDB server to run on too; the benchmark makes
        /// its own database there.
        #[arg(long, env = "MYSQL_URL")]
        mysql_url: Option<String>,
    },
    /// A fleet-wide mode switch: time until every instance has it, and
    /// the fleet's load on the primary at rest.
    Fleet {
        /// Instances of the guard.
        #[arg(long, default_value_t = 8)]
        instances: usize,
        /// Switches timed.
        #[arg(long, default_value_t = 100)]
        switches: usize,
    },
    /// The feed's size and dead tuples after writing with a 1-minute
    /// retention.
    Retention {
        /// Minutes of writing at 2 000 writes/s.
        #[arg(long, default_value_t = 10)]
        minutes: u64,
    },
    /// The MySQL/MariaDB backend: 32 writers on a watched table ÷ its
    /// unwatched twin, commit → filter latency, warm-up ÷ a plain SELECT.
    Mysql {
        /// A MySQL or MariaDB server; the benchmark makes its own database.
        #[arg(
            long,
            env = "MYSQL_URL",
            default_value = "mysql://root@127.0.0.1:3306/test"
        )]
        mysql_url: String,
        /// Seconds per measured writers' run (each statement runs four).
        #[arg(long, default_value_t = 4)]
        seconds: u64,
        /// Keys of the warm-up.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Propagation samples per load.
        #[arg(long, default_value_t = 300)]
        samples: usize,
        /// Only these parts: writers, propagation, warmup, deploy.
        #[arg(long, value_delimiter = ',')]
        parts: Vec<String>,
    },
    /// Draws chart.svg again from a results.json.
    Chart {
        /// The results file.
        #[arg(long)]
        from: PathBuf,
    },
    /// One warm-up in this process, reporting JSON (used by `warmup`).
    #[command(hide = true)]
    WarmupOne {
        #[arg(long)]
        source: warmup::SourceKind,
        #[arg(long)]
        url: String,
    },
}

/// How hard and how long to drive a service.
#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// Seconds measured per run (after one second of warm-up).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Existing keys in the hot set: `key-1` to `key-N`.
    #[arg(long, default_value_t = 1000)]
    hot_keys: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    match cli.command {
        Command::Run {
            binary,
            keys,
            load,
            fpp,
            rounds,
        } => {
            let settings = run::RunSettings {
                keys,
                duration: Duration::from_secs(load.seconds),
                connections: load.connections,
                hot_keys: load.hot_keys.min(keys),
                fpp,
                rounds: rounds.max(1),
            };
            run::run(&cli.database_url, &binary, &cli.out, &settings).await
        }
        Command::Barrier {
            binary,
            keys,
            seconds,
            connections,
            rate,
            instances,
            rounds,
        } => {
            let settings = barrier::BarrierSettings {
                keys,
                seconds,
                connections,
                rate,
                instances: instances.max(1),
                rounds: rounds.max(1),
            };
            barrier::barrier(&cli.database_url, &binary, &cli.out, &settings).await
        }
        Command::Start {
            binary,
            keys,
            rounds,
            url_options,
        } => {
            let settings = start::StartSettings {
                keys,
                rounds: rounds.max(1),
                url_options,
            };
            start::start(&cli.database_url, &binary, &cli.out, &settings).await
        }
        Command::Drive {
            addr,
            workload,
            load,
        } => {
            let addr = addr
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned();
            let label = format!("{addr} / {workload:?}");
            let measured = load::run(
                &addr,
                workload,
                load.hot_keys.max(1),
                load.connections,
                Duration::from_secs(1),
                Duration::from_secs(load.seconds),
                &label,
            )
            .await;
            println!("{}", serde_json::to_string_pretty(&measured)?);
            Ok(())
        }
        Command::Warmup { keys } => warmup::compare(&cli.database_url, keys, &cli.out).await,
        Command::Churn {
            keys,
            batch,
            rounds,
        } => churn::churn(&cli.database_url, &cli.out, keys, batch, rounds).await,
        Command::Deploy { keys } => deploy::compare(&cli.database_url, &cli.out, &keys).await,
        Command::Writers {
            seconds,
            writers,
            statements,
        } => writers::compare(&cli.database_url, &cli.out, seconds, &writers, &statements).await,
        Command::Propagation { samples } => {
            propagation::propagation(&cli.database_url, &cli.out, samples).await
        }
        Command::Idle => writers::idle(&cli.database_url, &cli.out).await,
        Command::Cross {
            binary,
            requests,
            mysql_url,
        } => {
            cross::cross(
                &cli.database_url,
                mysql_url.as_deref(),
                &binary,
                &cli.out,
                requests,
            )
            .await
        }
        Command::Fleet {
            instances,
            switches,
        } => fleet::switches(&cli.database_url, &cli.out, instances, switches).await,
        Command::Retention { minutes } => {
            writers::retention(&cli.database_url, &cli.out, minutes).await
        }
        Command::Mysql {
            mysql_url,
            seconds,
            keys,
            samples,
            parts,
        } => mysql::run(&mysql_url, &cli.out, seconds, keys, samples, &parts).await,
        Command::WarmupOne { source, url } => warmup::one(source, &url).await,
        Command::Chart { from } => {
            let rows: Vec<load::Row> = serde_json::from_slice(&std::fs::read(&from)?)?;
            chart::draw(&cli.out.join("chart.svg"), &rows)?;
            Ok(())
        }
    }
}
