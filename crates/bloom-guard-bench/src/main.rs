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
//! `bloom-load busy` floods the service with absent keys (64 connections,
//! by `wrk`) on each feed three times: alone, while 32 writers insert into
//! the guarded table, and while 32 writers insert into a table of another
//! database on the same server; with the refusals, the barrier's timeouts,
//! the log feed's commit-to-feed lag and its producer's catch-up.
//!
//! `bloom-load drive --addr 127.0.0.1:3000 --workload attack` drives a
//! service that is already running with one workload.
//!
//! `bloom-load warmup` loads 10M keys with `postgres::CopySource` and `QuerySource`
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
mod busy;
mod chart;
mod churn;
mod cli;
mod cross;
mod deploy;
mod fleet;
mod idle;
mod load;
mod log_twin;
mod mysql;
mod propagation;
mod retention;
mod run;
mod services;
mod start;
mod warmup;
mod writers;
mod wrk;

use std::time::Duration;

use clap::Parser;

use crate::cli::{Cli, Command};

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
            feed,
        } => {
            let settings = barrier::BarrierSettings {
                keys,
                seconds,
                connections,
                rate,
                instances: instances.max(1),
                rounds: rounds.max(1),
                feed,
            };
            barrier::barrier(&cli.database_url, &binary, &cli.out, &settings).await
        }
        Command::Busy {
            binary,
            keys,
            seconds,
            connections,
            writers,
            feeds,
        } => {
            let settings = busy::BusySettings {
                keys,
                seconds,
                connections,
                writers,
                feeds,
            };
            busy::busy(&cli.database_url, &binary, &cli.out, &settings).await
        }
        Command::Start {
            binary,
            keys,
            rounds,
            url_options,
            feed,
        } => {
            let settings = start::StartSettings {
                keys,
                rounds: rounds.max(1),
                url_options,
                feed,
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
            rounds,
            writers,
            statements,
            together,
        } => {
            writers::compare(
                &cli.database_url,
                &cli.out,
                writers::Runs {
                    seconds,
                    rounds,
                    together,
                },
                &writers,
                &statements,
            )
            .await
        }
        Command::Propagation { samples } => {
            propagation::propagation(&cli.database_url, &cli.out, samples).await
        }
        Command::Idle { binary, mysql_url } => {
            idle::idle(&cli.database_url, &binary, mysql_url.as_deref(), &cli.out).await
        }
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
            retention::retention(&cli.database_url, &cli.out, minutes).await
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
