//! Settings, from the environment.

use std::env;
use std::net::SocketAddr;

/// The service's settings. See the README's configuration table.
#[derive(Debug, Clone)]
pub struct Config {
    /// `BIND_ADDR`: the public API.
    pub bind_addr: SocketAddr,
    /// `ADMIN_ADDR`: the admin API.
    pub admin_addr: SocketAddr,
    /// `DATABASE_URL`: Postgres; unset, the SQLite file at `sqlite_path`.
    pub database_url: Option<String>,
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
    /// `BLOOM_DEBUG_HEADER`: `on` marks the guard's answers with
    /// `x-bloom-guard: absent` (for operators; off by default).
    pub debug_header: bool,
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
        if !(bloom_fpp > 0.0 && bloom_fpp < 1.0) {
            return Err(ConfigError {
                name: "BLOOM_FPP",
                value: bloom_fpp.to_string(),
                expected: "a rate strictly between 0 and 1, such as 0.001",
            });
        }
        let guard_enabled = switch("BLOOM_GUARD", true)?;
        let debug_header = switch("BLOOM_DEBUG_HEADER", false)?;
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
            database_url: var("DATABASE_URL"),
            sqlite_path: var("SQLITE_PATH").unwrap_or_else(|| "items-service.db".to_owned()),
            admin_token: var("ADMIN_TOKEN"),
            bloom_fpp,
            bloom_expected_items: parse("BLOOM_EXPECTED_ITEMS", "1000", "a whole number of keys")?,
            guard_enabled,
            rebuild_every_secs: parse("BLOOM_REBUILD_SECS", "3600", "a whole number of seconds")?,
            debug_header,
        })
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
