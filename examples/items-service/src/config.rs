//! Settings, from the environment.

use std::env;
use std::net::SocketAddr;
use std::time::Duration;

/// The service's settings. See the README's configuration table.
///
/// Its `Debug` output never shows the admin token or the database URL
/// (which may hold a password).
#[derive(Clone)]
pub struct Config {
    /// `BIND_ADDR`: the public API.
    pub bind_addr: SocketAddr,
    /// `ADMIN_ADDR`: the admin API.
    pub admin_addr: SocketAddr,
    /// `DATABASE_URL`: Postgres (`postgres://`) or MySQL and MariaDB
    /// (`mysql://`, `mariadb://`); unset, the SQLite file at `sqlite_path`.
    pub database_url: Option<String>,
    /// `DATABASE_REPLICA_URL`: a hot standby of `DATABASE_URL`'s Postgres
    /// server; reads by key and the guards' feed reads go to it first.
    pub database_replica_url: Option<String>,
    /// `SQLITE_PATH`: the embedded database's file.
    pub sqlite_path: String,
    /// `ADMIN_TOKEN`: the admin API's bearer token; unset, no admin API.
    pub admin_token: Option<String>,
    /// `BLOOM_FPP`: the filter's target false-positive rate.
    pub bloom_fpp: f64,
    /// `BLOOM_EXPECTED_ITEMS`: a floor for the filter's size.
    pub bloom_expected_items: u64,
    /// `BLOOM_GUARD`: `off` serves the same API without the guard.
    pub guard_enabled: bool,
    /// `BLOOM_REBUILD_SECS`: seconds between scheduled rebuilds (0: none).
    pub rebuild_every_secs: u64,
    /// `BLOOM_SNAPSHOTS`: `off` makes every instance scan at start instead
    /// of adopting the fleet's snapshot (Postgres only).
    pub snapshots: bool,
    /// `BLOOM_FEED`: where a Postgres, MySQL or MariaDB database's changes
    /// come from.
    pub feed: Feed,
    /// `BLOOM_READ_BARRIER`: `off` lets the guard refuse on its filter as
    /// it is, without waiting for a feed read begun after the request (a
    /// key created on another instance is then refused for the
    /// propagation window); on by default.
    pub read_barrier: bool,
    /// `BLOOM_DEBUG_HEADER`: `on` marks the guard's answers with
    /// `x-bloom-guard: absent` (for operators; off by default).
    pub debug_header: bool,
    /// `BLOOM_INSTANCE`: this instance's name in the fleet view
    /// (`GET /admin/bloom/{guard}/fleet`); unset, `host:pid`.
    pub instance: Option<String>,
    /// `BLOOM_MODE`: what every guard does with its verdicts until a mode
    /// is stored for the fleet (`PUT /admin/bloom/{guard}/mode`).
    pub mode: bloom_guard::Mode,
    /// `BLOOM_AUDIT_RATE`: in enforce mode, the share of would-be
    /// rejections passed on and checked (default 0.001: one in a thousand
    /// reaches the handler, so a false negative shows in
    /// `bloom_guard_false_negatives_total`).
    pub audit_rate: f64,
    /// `SEED_DEMO`: `on` inserts the demo items into an empty Postgres or
    /// MySQL table at start (a new SQLite file always gets them).
    pub seed_demo: bool,
    /// `MAX_CONNECTIONS`: connections served at once on each port.
    pub max_connections: usize,
    /// `FIRST_BYTES_TIMEOUT_SECS`: how long a new connection has to tell
    /// its protocol.
    pub first_bytes_timeout: Duration,
    /// `IDLE_TIMEOUT_SECS`: how long a connection may have no request in
    /// flight.
    pub idle_timeout: Duration,
    /// `HTTP2_KEEP_ALIVE_SECS`: how often HTTP/2 connections are pinged.
    pub keep_alive_interval: Duration,
    /// `HTTP2_KEEP_ALIVE_TIMEOUT_SECS`: how long an HTTP/2 client has to
    /// answer a ping.
    pub keep_alive_timeout: Duration,
}

/// The most keys a filter is sized for from settings (about 7 GiB of bits
/// at a 0.1% rate).
/// The longest key, in bytes: the handlers refuse longer ones with a 400
/// (the guard passes them on unchecked, and checks every shorter key).
pub const MAX_KEY_LEN: usize = 512;

const MAX_EXPECTED_ITEMS: u64 = 4_000_000_000;

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |set: bool| if set { "<redacted>" } else { "<unset>" };
        f.debug_struct("Config")
            .field("bind_addr", &self.bind_addr)
            .field("admin_addr", &self.admin_addr)
            .field("database_url", &redacted(self.database_url.is_some()))
            .field(
                "database_replica_url",
                &redacted(self.database_replica_url.is_some()),
            )
            .field("sqlite_path", &self.sqlite_path)
            .field("feed", &self.feed)
            .field("read_barrier", &self.read_barrier)
            .field("admin_token", &redacted(self.admin_token.is_some()))
            .field("bloom_fpp", &self.bloom_fpp)
            .field("bloom_expected_items", &self.bloom_expected_items)
            .field("guard_enabled", &self.guard_enabled)
            .field("rebuild_every_secs", &self.rebuild_every_secs)
            .field("snapshots", &self.snapshots)
            .field("instance", &self.instance)
            .field("debug_header", &self.debug_header)
            .field("seed_demo", &self.seed_demo)
            .field("mode", &self.mode)
            .field("audit_rate", &self.audit_rate)
            .field("max_connections", &self.max_connections)
            .field("first_bytes_timeout", &self.first_bytes_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .finish()
    }
}

/// A setting that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{name}={value:?} is not valid: {expected}")]
pub struct ConfigError {
    name: &'static str,
    value: String,
    expected: &'static str,
}

impl Config {
    /// Reads the settings from the environment.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first variable that does not parse.
    pub fn from_env() -> Result<Self, ConfigError> {
        let bloom_fpp: f64 = parse(
            "BLOOM_FPP",
            "0.001",
            "a rate between 0 and 1, such as 0.001",
        )?;
        // Outside these, the filter would be useless or would not fit in memory.
        if !(1e-9..=0.5).contains(&bloom_fpp) {
            return Err(ConfigError {
                name: "BLOOM_FPP",
                value: bloom_fpp.to_string(),
                expected: "a rate from 0.000000001 to 0.5, such as 0.001",
            });
        }
        let bloom_expected_items: u64 =
            parse("BLOOM_EXPECTED_ITEMS", "1000", "a whole number of keys")?;
        if bloom_expected_items > MAX_EXPECTED_ITEMS {
            return Err(ConfigError {
                name: "BLOOM_EXPECTED_ITEMS",
                value: bloom_expected_items.to_string(),
                expected: "at most 4 000 000 000 keys",
            });
        }
        let guard_enabled = switch("BLOOM_GUARD", true)?;
        let mode = parse("BLOOM_MODE", "enforce", "enforce, shadow or off")?;
        let audit_rate: f64 = parse(
            "BLOOM_AUDIT_RATE",
            "0.001",
            "a rate between 0 and 1, such as 0.001",
        )?;
        if !(0.0..=1.0).contains(&audit_rate) {
            return Err(ConfigError {
                name: "BLOOM_AUDIT_RATE",
                value: audit_rate.to_string(),
                expected: "a rate between 0 and 1, such as 0.001",
            });
        }
        let debug_header = switch("BLOOM_DEBUG_HEADER", false)?;
        let database_url = var("DATABASE_URL");
        let feed: Feed = parse("BLOOM_FEED", "triggers", "triggers or log")?;
        feed.check(database_url.as_deref())?;
        let database_replica_url = var("DATABASE_REPLICA_URL");
        check_replica(database_url.as_deref(), database_replica_url.as_deref())?;
        Ok(Self {
            bind_addr: parse(
                "BIND_ADDR",
                "127.0.0.1:3000",
                "an address such as 127.0.0.1:3000",
            )?,
            admin_addr: parse(
                "ADMIN_ADDR",
                "127.0.0.1:3001",
                "an address such as 127.0.0.1:3001",
            )?,
            database_url,
            database_replica_url,
            feed,
            sqlite_path: var("SQLITE_PATH").unwrap_or_else(|| "items-service.db".to_owned()),
            admin_token: var("ADMIN_TOKEN"),
            bloom_fpp,
            bloom_expected_items,
            guard_enabled,
            rebuild_every_secs: parse("BLOOM_REBUILD_SECS", "0", "a whole number of seconds")?,
            debug_header,
            read_barrier: switch("BLOOM_READ_BARRIER", true)?,
            mode,
            audit_rate,
            seed_demo: switch("SEED_DEMO", false)?,
            snapshots: switch("BLOOM_SNAPSHOTS", true)?,
            instance: var("BLOOM_INSTANCE"),
            max_connections: parse("MAX_CONNECTIONS", "10000", "a whole number of connections")?,
            first_bytes_timeout: seconds("FIRST_BYTES_TIMEOUT_SECS", 10)?,
            idle_timeout: seconds("IDLE_TIMEOUT_SECS", 60)?,
            keep_alive_interval: seconds("HTTP2_KEEP_ALIVE_SECS", 20)?,
            keep_alive_timeout: seconds("HTTP2_KEEP_ALIVE_TIMEOUT_SECS", 20)?,
        })
    }
}

/// Where a Postgres, MySQL or MariaDB database's changes come from
/// (`BLOOM_FEED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// `triggers` (the default): the feed's triggers on each watched table.
    Triggers,
    /// `log`: the database's own log, no trigger on the tables: Postgres's
    /// write-ahead log, decoded from a logical replication slot
    /// (`wal_level=logical`), or the binary log of MySQL or MariaDB, read
    /// over the replication protocol (`binlog_format=ROW`).
    Log,
}

/// A replica is read on Postgres only.
fn check_replica(database_url: Option<&str>, replica: Option<&str>) -> Result<(), ConfigError> {
    if replica.is_some() && !is_postgres(database_url) {
        return Err(ConfigError {
            name: "DATABASE_REPLICA_URL",
            // Not repeated: it may hold a password.
            value: "(set)".to_owned(),
            expected:
                "unset, unless DATABASE_URL is a postgres:// URL (replicas are read on Postgres)",
        });
    }
    Ok(())
}

/// Whether `database_url` names a Postgres database.
fn is_postgres(database_url: Option<&str>) -> bool {
    database_url
        .is_some_and(|url| url.starts_with("postgres://") || url.starts_with("postgresql://"))
}

/// Whether `database_url` names a MySQL or MariaDB database.
fn is_mysql(database_url: Option<&str>) -> bool {
    database_url.is_some_and(|url| url.starts_with("mysql://") || url.starts_with("mariadb://"))
}

impl Feed {
    /// The log feeds are Postgres's, MySQL's and MariaDB's: refused for
    /// SQLite.
    fn check(self, database_url: Option<&str>) -> Result<(), ConfigError> {
        if self == Feed::Log && !is_postgres(database_url) && !is_mysql(database_url) {
            return Err(ConfigError {
                name: "BLOOM_FEED",
                value: "log".to_owned(),
                expected: "triggers, unless DATABASE_URL is a postgres:// or mysql:// URL (SQLite has no log to read)",
            });
        }
        Ok(())
    }
}

impl std::str::FromStr for Feed {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        match value {
            "triggers" => Ok(Self::Triggers),
            "log" => Ok(Self::Log),
            _ => Err(()),
        }
    }
}

/// An on/off variable.
fn switch(name: &'static str, default: bool) -> Result<bool, ConfigError> {
    let Some(value) = var(name) else {
        return Ok(default);
    };
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(ConfigError {
            name,
            value,
            expected: "on or off",
        }),
    }
}

/// A deadline in whole seconds; zero would close every connection at once.
fn seconds(name: &'static str, default: u64) -> Result<Duration, ConfigError> {
    const EXPECTED: &str = "a whole number of seconds, at least 1";
    let value = var(name).unwrap_or_else(|| default.to_string());
    match value.parse::<u64>() {
        Ok(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err(ConfigError {
            name,
            value,
            expected: EXPECTED,
        }),
    }
}

/// A variable's value; unset and empty are the same.
fn var(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

fn parse<T: std::str::FromStr>(
    name: &'static str,
    default: &str,
    expected: &'static str,
) -> Result<T, ConfigError> {
    let value = var(name).unwrap_or_else(|| default.to_owned());
    value.parse().map_err(|_| ConfigError {
        name,
        value,
        expected,
    })
}

#[cfg(test)]
mod tests;
