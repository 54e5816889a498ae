//! `bloom-load`'s command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::load::Workload;
use crate::warmup;

#[derive(Debug, Parser)]
#[command(about = "Load and warm-up benchmarks of bloom-guard")]
pub(crate) struct Cli {
    /// A Postgres server; the benchmark creates its own databases there.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub(crate) database_url: String,
    /// Where results.json and chart.svg go.
    #[arg(long, default_value = "bench-results")]
    pub(crate) out: PathBuf,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
        /// The services' change feed: `triggers` or `log` (the server
        /// with `wal_level=logical`).
        #[arg(long, default_value = "triggers")]
        feed: String,
    },
    /// A flood of absent keys while the server writes, on each feed:
    /// alone, with writers on the guarded table, with writers on another
    /// database of the same server (needs `wrk`; the log feed needs the
    /// server with `wal_level=logical`).
    Busy {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// Rows in the items table.
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// Seconds per flood.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The flood's connections.
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Writers, each one one-row insert at a time.
        #[arg(long, default_value_t = 32)]
        writers: usize,
        /// The feeds, in turn.
        #[arg(long, value_delimiter = ',', default_value = "triggers,log")]
        feeds: Vec<String>,
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
        /// The services' change feed: `triggers` or `log` (the server
        /// with `wal_level=logical`).
        #[arg(long, default_value = "triggers")]
        feed: String,
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
        /// Seconds per measured run.
        #[arg(long, default_value_t = 4)]
        seconds: u64,
        /// Runs per table and cell, the tables in turn; the cell reports
        /// their mean.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Only these numbers of writers (default 1, 8 and 32).
        #[arg(long, value_delimiter = ',')]
        writers: Vec<usize>,
        /// Only these statements: insert, insert_100, update_key, delete.
        #[arg(long, value_delimiter = ',')]
        statements: Vec<String>,
        /// Each feed's table and the twin at the same time, each with the
        /// cell's writers: what a feed costs its own writers, with the
        /// machine's drifts (and the server's log decoding) on both.
        #[arg(long)]
        together: bool,
    },
    /// Commit → another instance's filter, idle and under 2 000 writes/s.
    Propagation {
        /// Samples per kind of write and load.
        #[arg(long, default_value_t = 300)]
        samples: usize,
    },
    /// What idle instances of the example service cost the database:
    /// transactions a second on Postgres (1, 2 and 8 instances, one process
    /// each) and, with `--mysql-url`, statements a second on MySQL.
    Idle {
        /// The items-service binary.
        #[arg(long, default_value = "target/release/items-service")]
        binary: PathBuf,
        /// A MySQL or MariaDB server to measure one instance on too.
        #[arg(long)]
        mysql_url: Option<String>,
    },
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
        /// Only these parts: writers, propagation, flood, catchup, idle, warmup, deploy.
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
pub(crate) struct LoadArgs {
    /// Seconds measured per run (after one second of warm-up).
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 32)]
    pub(crate) connections: usize,
    /// Existing keys in the hot set: `key-1` to `key-N`.
    #[arg(long, default_value_t = 1000)]
    pub(crate) hot_keys: u64,
}
